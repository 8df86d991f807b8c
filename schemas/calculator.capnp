@0x85150b117366d14b;
# The calculator service from Cap'n Proto's C++ samples, used for interop tests
# against the reference implementation.
#
# Node IDs are derived from the file ID and the nesting path, so the file ID,
# the type names and the nesting below must stay exactly as they are: other
# implementations' generated code refers to these IDs
# (Calculator 0x97983392df35cc36, Calculator.Value 0xc3e69d34d3ee48d2,
# Calculator.Function 0xede83a3d96840394).

interface Calculator {
  # Evaluates arithmetic expressions. Results come back as `Value` capabilities
  # so that a client can feed one result into the next call without waiting
  # for it (promise pipelining).

  evaluate @0 (expression :Expression) -> (value :Value);
  # Evaluates `expression`. The returned Value holds the result.

  struct Expression {
    # An expression tree.
    union {
      literal @0 :Float64;
      # A constant number.

      previousResult @1 :Value;
      # The result of an earlier evaluate(); may still be a promise.

      parameter @2 :UInt32;
      # The index of a parameter. Only valid in the body of a function
      # created with defFunction().

      call :group {
        # Applies `function` to the values of `params`.
        function @3 :Function;
        params @4 :List(Expression);
      }
    }
  }

  interface Value {
    # A computed number, held by the server.
    read @0 () -> (value :Float64);
  }

  defFunction @1 (paramCount :Int32, body :Expression) -> (func :Function);
  # Defines a function of `paramCount` parameters whose result is `body`,
  # evaluated with its `parameter` leaves bound to the call's arguments.

  interface Function {
    # A function of floating-point numbers. May be hosted by the server or
    # by the client (the server then calls back into the client).
    call @0 (params :List(Float64)) -> (value :Float64);
  }

  getOperator @2 (op :Operator) -> (func :Function);
  # A Function of two parameters that applies the given operator.

  enum Operator {
    add @0;
    subtract @1;
    multiply @2;
    divide @3;
  }
}
