# catrank: the "string-heavy" case of the serialization benchmark suite.
# Field table: /work/shared/specs/benchmarks.md §3.
@0x82beb8e37ff79aba;

struct SearchResultList {
  results @0 :List(SearchResult);
}

struct SearchResult {
  url @0 :Text;
  score @1 :Float64;
  snippet @2 :Text;
}
