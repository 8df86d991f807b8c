@0xe1a6c5a0f1f2b3c4;
# Every type kind the generator handles (capsvc gen): the golden file and the round-trip
# tests of generated codecs against pycapnp use this schema.

using Other = import "kitchen_other.capnp";

enum Color {
  red @0;
  green @1;
  blue @2;
}

struct Numbers {
  b @0 :Bool;
  i8 @1 :Int8;
  i16 @2 :Int16;
  i32 @3 :Int32;
  i64 @4 :Int64;
  u8 @5 :UInt8;
  u16 @6 :UInt16;
  u32 @7 :UInt32;
  u64 @8 :UInt64;
  f32 @9 :Float32;
  f64 @10 :Float64;
  color @11 :Color;
  b2 @12 :Bool;
  v @13 :Void;
}

struct Defaults {
  # Stored XOR their defaults: a zeroed struct reads as these.
  b @0 :Bool = true;
  i8 @1 :Int8 = -7;
  i16 @2 :Int16 = 1234;
  i32 @3 :Int32 = -100000;
  i64 @4 :Int64 = 1234567890123;
  u8 @5 :UInt8 = 200;
  u16 @6 :UInt16 = 65000;
  u32 @7 :UInt32 = 4000000000;
  u64 @8 :UInt64 = 18000000000000000000;
  f32 @9 :Float32 = 1.5;
  f64 @10 :Float64 = -2.25;
  color @11 :Color = blue;
  text @12 :Text = "hello";
  data @13 :Data = 0x"0102fe";
  numbers @14 :Numbers = (i32 = 42, color = green, b = true);
  list @15 :List(Int16) = [1, -2, 3];
  texts @16 :List(Text) = ["a", "bc"];
}

struct Lists {
  voids @0 :List(Void);
  bools @1 :List(Bool);
  i8s @2 :List(Int8);
  i16s @3 :List(Int16);
  i32s @4 :List(Int32);
  i64s @5 :List(Int64);
  u8s @6 :List(UInt8);
  u16s @7 :List(UInt16);
  u32s @8 :List(UInt32);
  u64s @9 :List(UInt64);
  f32s @10 :List(Float32);
  f64s @11 :List(Float64);
  texts @12 :List(Text);
  datas @13 :List(Data);
  structs @14 :List(Numbers);
  colors @15 :List(Color);
  nested @16 :List(List(Int32));
  nestedTexts @17 :List(List(Text));
  deep @18 :List(List(List(UInt8)));
}

struct Shapes {
  name @0 :Text;
  union {
    circle @1 :Float64;
    square :group {
      side @2 :Float32;
      label @3 :Text;
    }
    nothing @4 :Void;
    points @5 :List(Int32);
  }
  style :group {
    color @6 :Color;
    fill :union {
      solid @7 :Void;
      pattern @8 :Text;
      gradient :group {
        from @9 :Color;
        to @10 :Color;
      }
    }
  }
}

struct Tree {
  value @0 :Int32;
  children @1 :List(Tree);
  left @2 :Tree;
  other @3 :Other.Thing;
  anything @4 :AnyPointer;

  struct Reader {
    # A nested type named like a generated class: renamed Reader_.
    x @0 :UInt8;
  }
}

struct Anything {
  # AnyPointer and its constrained forms are explicit types.
  pointer @0 :AnyPointer;
  anyStruct @1 :AnyStruct;
  anyList @2 :AnyList;
  capability @3 :Capability;
  shop @4 :Shop;
  shops @5 :List(Shop);
}

struct Keywords {
  return @0 :Int32;
  class @1 :Text;
  from @2 :Bool;
  which @3 :UInt8;
  async @4 :Int16;
}

interface Shop {
  buy @0 (item :Text, count :UInt32) -> (total :Float64, receipt :Numbers);
  list @1 () -> (items :List(Text));
  peek @2 (tree :Tree) -> ();
}

# Generics: each binding a field or an `extends` uses becomes a specialized class
# (Box_Text, Store_Text, ...); a generic used bare reads its parameters as AnyPointer.
struct Box(T) {
  value @0 :T;
  next @1 :Box(T);
  label @2 :Text;
}

struct Pair(K, V) {
  key @0 :K;
  value @1 :V;
}

struct Boxes {
  texts @0 :Box(Text);
  numbers @1 :Box(List(Int32));
  trees @2 :Box(Tree);
  shops @3 :Box(Shop);
  pair @4 :Pair(Text, Box(Text));
  bare @5 :Box;
}

# A generic nested in a generic, bound two ways inside one binding of its parent: two
# classes (Shelf_Tree.Slot_Text, Shelf_Tree.Slot_List_Int32), not one overwriting the other.
struct Shelf(T) {
  struct Slot(U) {
    item @0 :T;
    extra @1 :U;
  }
  using TextSlot = Slot(Text);
}

struct Shelves {
  texts @0 :Shelf(Tree).Slot(Text);
  numbers @1 :Shelf(Tree).Slot(List(Int32));
  aliased @2 :Shelf(Tree).TextSlot = (extra = "by alias");
}

# Nested nodes of a struct that a field reaches before its declaration: generated even
# though no field uses them (capsvc gen once missed them; the compiler plugin did not).
struct Parcel {
  contents @0 :Crate;
}

struct Crate {
  enum Seal {
    open @0;
    shut @1;
  }
  const capacity :UInt8 = 12;
  weight @0 :UInt16;
}

# A struct default that holds a struct: a dict given for the inner one merges into what
# the default put there, as pycapnp's new_message(**fields) does (test.capnp's
# TestDefaults once built differently here).
struct Layered {
  outer @0 :Wrapper = (label = "outer", numbers = (i32 = 42, u8 = 7), tags = ["a"]);
}

struct Wrapper {
  label @0 :Text;
  numbers @1 :Numbers;
  tags @2 :List(Text);
}

# A default that holds its own field, null: to a (lazy) reader that field's default is
# the same value again, without end; an (eager) row stops where a default meets itself.
struct Recurring {
  label @0 :Text;
  again @1 :Recurring = (label = "again");
  many @2 :List(Recurring) = [(label = "first")];
}

# A union whose first member (the one an empty message has set) is a pointer: to_dict
# names the member set even when its pointer is null, as pycapnp does.
struct Choice {
  union {
    note @0 :Text;
    numbers @1 :Numbers;
    count @2 :UInt32;
  }
}

# Fields and a method named after Python's builtin types: the generated classes keep the
# names, and where such a member would shadow the type in its class's annotations they
# say `_builtins.str` (mypy --strict over this module checks it).
struct Builtins {
  str @0 :Text;
  bytes @1 :Data;
  bool @2 :Bool;
  int @3 :Int32;
  list @4 :List(Text);
  type @5 :Float64;
}

interface Converter {
  str @0 (int :Int64) -> (str :Text);
}

# A streaming method: on the wire an ordinary call whose results are stream.capnp's
# StreamResult (imported implicitly from /capnp/stream.capnp: pycapnp's copy).
interface Sink {
  write @0 (chunk :Data) -> stream;
  total @1 () -> (bytes :UInt64, writes :UInt32);
}

interface Store(T) {
  put @0 (value :T) -> ();
  get @1 () -> (value :T, box :Box(T));
}

interface TextStore extends(Store(Text)) {
  size @0 () -> (count :UInt32);
}

# extends, and the diamond: Diamond reaches Base's method through both Left and Right.
# Declared before its bases, so the generator must order the classes itself.
interface Diamond extends(Left, Right) {
  # Parameter names that are Python keywords, `self`, or the generated method's locals.
  tricky @0 (self :Text, request :UInt8, params :Bool, unknown :Int32, from :Int16)
      -> (return :Text, self :Diamond);
}

interface Base {
  depth @0 () -> (depth :UInt32);
}

interface Left extends(Base) {
  left @0 () -> (side :Text);
}

interface Right extends(Base) {
  right @0 () -> (side :Text);
}

# A Capability param and result: a capability of no particular interface, retyped by
# whoever knows what it is (cast_as; pycapnp says as_interface).
interface Relay {
  relay @0 (cap :Capability) -> (cap :Capability);
}

# A method named like one of the interface it extends (each interface has its own
# methods): in Python the newcomer takes a trailing underscore (Loud.left_,
# left__request), so a server answers each call with its own method.
interface Loud extends(Left) {
  left @0 (volume :Float64 = inf) -> (side :Text);
}

# Constants of an enum declared after them (in a struct and at the top): set once the
# module's classes exist.
struct Settings {
  const fallback :Mood = cross;
  mood @0 :Mood = calm;
}

enum Mood {
  calm @0;
  cross @1;
}

const bestMood :Mood = calm;
const answer :Int32 = 42;
const infinity :Float64 = inf;
const lowest :Float64 = -inf;
const notANumber :Float32 = nan;
const greeting :Text = "hi there";
const origin :Numbers = (i16 = -5, color = red);
const primes :List(UInt16) = [2, 3, 5, 7];
const pi :Float64 = 3.14159;
