# eval: the "pointer-heavy" case of the serialization benchmark suite.
# Definitions: /work/shared/specs/benchmarks.md §4. Each side of an expression is a union
# group: either a literal Int32 or a nested Expression.
@0xe12dc4c3e70e9eda;

enum Operation {
  add @0;
  subtract @1;
  multiply @2;
  divide @3;
  modulus @4;
}

struct Expression {
  op @0 :Operation;

  left :union {
    value @1 :Int32;
    expression @2 :Expression;
  }

  right :union {
    value @3 :Int32;
    expression @4 :Expression;
  }
}

struct EvaluationResult {
  value @0 :Int32;
}
