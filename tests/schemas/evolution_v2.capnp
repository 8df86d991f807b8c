@0xc7b3f1d2a4e59601;
# Version 2 of evolution_v1.capnp (same file and struct IDs): new data and pointer fields,
# some with non-zero defaults, and List(Int32) / List(Text) upgraded to lists of structs
# whose first field is the old element (as the encoding spec allows).

enum Color @0xe2d4a6b8c0f11205 {
  red @0;
  green @1;
  blue @2;
}

struct Item @0xe2d4a6b8c0f11201 {
  x @0 :Int32;
  label @1 :Text;
  weight @2 :Float64 = 0.5;
}

struct Word @0xe2d4a6b8c0f11204 {
  text @0 :Text;
  n @1 :UInt8 = 3;
}

struct Record @0xe2d4a6b8c0f11202 {
  id @0 :UInt32;
  name @1 :Text;
  values @2 :List(Item);  # was List(Int32)
  child @3 :Record;
  words @4 :List(Word);  # was List(Text)
  things @5 :List(Item);
  flag @6 :Bool = true;
  count @7 :Int64 = -42;
  score @8 :Float32 = 2.5;
  note @9 :Text = "unset";
  extra @10 :Item = (x = 5, label = "five");
  tags @11 :List(Text) = ["a", "b"];
  color @12 :Color = blue;
}
