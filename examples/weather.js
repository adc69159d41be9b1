// Compare the cities' temperatures, then look at the warmest one's forecast.
const cities = await tools.list_cities();
const readings = await Promise.all(cities.map((city) => tools.current_temperature({ city })));
readings.sort((a, b) => b.degrees - a.degrees);
for (const reading of readings) {
  text(`${reading.city}: ${reading.degrees} ${reading.unit}`);
}
const warmest = readings[0].city;
const days = await tools.forecast({ city: warmest, days: 2 });
text(`${warmest} forecast: ${JSON.stringify(days)}`);
