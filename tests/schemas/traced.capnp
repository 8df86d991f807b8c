@0xc4e1f2a3b5d60718;
# Two services whose calls carry a W3C trace context in their params (capsvc.otel).

interface Front {
  hello @0 (name :Text, traceparent :Text) -> (greeting :Text);
  # Asks the Back service for a greeting, passing the trace on.
}

interface Back {
  greet @0 (name :Text, traceparent :Text) -> (greeting :Text);
  fail @1 () -> ();
}
