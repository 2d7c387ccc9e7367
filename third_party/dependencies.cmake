# How belay finds what it builds on: Debian packages only (third_party/install_deps.sh
# installs them), nothing downloaded at build time, nothing vendored.
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(CLI11 2.1 CONFIG REQUIRED)
find_package(OpenMP REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
if(BUILD_TESTING OR NOT DEFINED BUILD_TESTING)
  find_package(Catch2 2 REQUIRED)
endif()
