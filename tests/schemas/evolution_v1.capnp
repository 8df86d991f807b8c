@0xc7b3f1d2a4e59601;
# Version 1 of a schema that evolves (tests/codegen/test_evolution.py): evolution_v2.capnp
# has the same file and struct IDs, adds fields, and upgrades two lists to lists of structs.

struct Item @0xe2d4a6b8c0f11201 {
  x @0 :Int32;
}

struct Record @0xe2d4a6b8c0f11202 {
  id @0 :UInt32;
  name @1 :Text;
  values @2 :List(Int32);
  child @3 :Record;
  words @4 :List(Text);
  things @5 :List(Item);
}
