// engine/text_fields.h: the one split of a CSV line and the one reading of a count.
#include <catch2/catch.hpp>

#include "engine/text_fields.h"

using namespace belay;

TEST_CASE("split_fields keeps every field, empty ones and the last included", "[engine][text]") {
  using V = std::vector<std::string>;
  CHECK(split_fields("a,b,c") == V{"a", "b", "c"});
  CHECK(split_fields("") == V{""});
  CHECK(split_fields(",") == V{"", ""});
  CHECK(split_fields("40,0.001,inf,0,3,1,nonfinite_grad,1,,wte.weight") ==
        V{"40", "0.001", "inf", "0", "3", "1", "nonfinite_grad", "1", "", "wte.weight"});
  CHECK(split_fields("1,2,") == V{"1", "2", ""});  // a trailing empty column (an applied step's nonfinite_tensors)
  CHECK(split_fields(" a , b") == V{" a ", " b"});  // spaces are the fields'
}

TEST_CASE("parse_count reads the digits belay writes and nothing else", "[engine][text]") {
  CHECK(parse_count("0") == 0);
  CHECK(parse_count("40") == 40);
  CHECK(parse_count("007") == 7);
  CHECK(parse_count("999999999999999999") == 999999999999999999);  // 18 digits
  for (const char* bad : {"", "+4", "-4", " 4", "4 ", "4.0", "1e3", "0x10", "inf", "nan", "4,", "abc",
                          "1000000000000000000" /* 19 digits */, "99999999999999999999"})
    CHECK_FALSE(parse_count(bad).has_value());
}
