# How belay finds what it builds on: Debian packages only (third_party/install_deps.sh
# installs them), nothing downloaded at build time, nothing vendored in git.
# BELAY_DEPS_PREFIX: a folder with the same packages unpacked (third_party/vendor_gpu_deps.sh
# makes <repo>/third_party/vendored/usr, git-ignored) for a machine without them and without
# a network, such as the lent GPU machine (bench/gpu-check.sh passes it); searched first.
set(BELAY_DEPS_PREFIX "" CACHE PATH "a prefix holding Eigen, CLI11, nlohmann-json, Catch2 and PCRE2 (third_party/vendor_gpu_deps.sh)")
if(BELAY_DEPS_PREFIX)
  if(NOT EXISTS "${BELAY_DEPS_PREFIX}/include/eigen3")
    message(FATAL_ERROR "belay: BELAY_DEPS_PREFIX=${BELAY_DEPS_PREFIX} holds no include/eigen3: "
                        "make it with third_party/vendor_gpu_deps.sh (its usr/ folder), or unset it")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${BELAY_DEPS_PREFIX}")
endif()
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(CLI11 2.1 CONFIG REQUIRED)
find_package(OpenMP REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
if(BUILD_TESTING OR NOT DEFINED BUILD_TESTING)
  find_package(Catch2 2 REQUIRED)
endif()
# PCRE2 (Debian: libpcre2-dev), the regular expressions of GPT-2's pre-tokenizer (apps/text/).
find_path(BELAY_PCRE2_INCLUDE_DIR pcre2.h)
find_library(BELAY_PCRE2_LIBRARY NAMES pcre2-8)
if(NOT BELAY_PCRE2_INCLUDE_DIR OR NOT BELAY_PCRE2_LIBRARY)
  message(FATAL_ERROR "belay: PCRE2 (libpcre2-8) not found: apt-get install libpcre2-dev (third_party/install_deps.sh)")
endif()
