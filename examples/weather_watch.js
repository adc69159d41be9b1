// Watch the forecast day by day: each day is handed to the model at once (yield_control),
// then the cell keeps running; the `codemode` command (or the model) calls `wait` for more.
const days = await tools.forecast({ city: "Oslo", days: 3 });
for (const day of days) {
  text(`day ${day.day}: ${day.low} to ${day.high} C, ${day.sky}`);
  if (day.day < days.length) {
    yield_control();
    await new Promise((resolve) => setTimeout(resolve, 300));
  }
}
text("watch over");
