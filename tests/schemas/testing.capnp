@0xc4b34f6e66f443a7;
# Interfaces that exercise every corner of the protocol in tests (capabilities at any
# depth, callbacks, reflection back to the caller, failures, slow calls).

interface Counter {
  increment @0 (by :Int64) -> (value :Int64);
  get @1 () -> (value :Int64);
}

interface Callback {
  notify @0 (value :Int64) -> (ack :Int64);
}

struct Holder {
  name @0 :Text;
  cap @1 :Counter;
  inner @2 :Holder;
  caps @3 :List(Counter);
  items @4 :List(Holder);
  choice :union {
    none @5 :Void;
    counter @6 :Counter;
    text @7 :Text;
  }
  extra :group {
    number @8 :Int32;
    callback @9 :Callback;
  }
}

interface Tester {
  echo @0 (msg :Text) -> (reply :Text);
  # Returns msg unchanged.

  newCounter @1 (start :Int64) -> (counter :Counter);
  # A fresh Counter hosted by the callee.

  callBack @2 (cb :Callback, value :Int64) -> (ack :Int64);
  # Calls cb.notify(value) and returns its ack.

  holdCaps @3 (holder :Holder) -> (holder :Holder);
  # Returns the holder unchanged, capabilities included.

  fail @4 (kind :Text, reason :Text) -> ();
  # Raises an exception of the given type (failed, overloaded, disconnected, unimplemented).

  slow @5 (ms :UInt32) -> (done :Bool);
  # Sleeps ms milliseconds (cancellable), then returns true.

  getSelf @6 () -> (self :Tester);
  # Returns a capability to this same object.

  reflect @7 (cap :Counter) -> (cap :Counter);
  # Returns the capability it was given (it goes back to the caller: embargo territory).

  callCounter @8 (counter :Counter, by :Int64) -> (value :Int64);
  # Calls counter.increment(by) and returns its value.

  sum @9 (counters :List(Counter)) -> (total :Int64);
  # Sum of get() over every counter in the list.
}

interface Unknown {
  # An interface nobody implements: calling it must give `unimplemented`.
  nothing @0 () -> ();
}
