// Tool errors reach the cell as plain strings it can catch.
try {
  await tools.current_temperature({ city: "Atlantis" });
} catch (error) {
  text(`caught: ${error}`);
}
// Arguments are checked against the tool's signature before it runs.
try {
  await tools.forecast({ city: "Paris", days: 10 });
} catch (error) {
  text(`caught: ${error}`);
}
// An uncaught error fails the cell: the model sees the output so far and the error.
await tools.current_temperature({ town: "Paris" });
text("not reached");
