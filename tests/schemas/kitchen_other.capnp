@0xe1a6c5a0f1f2b3c5;
# Imported by kitchen.capnp: generated modules import each other as the schemas do.

struct Thing {
  id @0 :UInt64;
  tag @1 :Text;
  kind @2 :Kind;

  enum Kind {
    small @0;
    large @1;
  }
}
