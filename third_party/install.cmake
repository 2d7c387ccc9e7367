# cmake --install <build> --prefix <dir>: the headers by room under include/belay/, the static
# libraries and the CLI, and lib/cmake/belay/ with belayConfig.cmake, its version file and the
# exported targets. A user writes find_package(belay 0.1 CONFIG REQUIRED) and links
# belay::belay; the config finds what the libraries were built against (Eigen, OpenMP,
# nlohmann_json, and the CUDA runtime in a CUDA build), so nothing else is to be named.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public headers: every header of the rooms a user's code may include. kernels/ stays
# out: no public header includes it (tests/install/check_install.sh compiles the consumer
# against the installed tree alone, which would fail if one did).
# Of apps/, the training library's room (apps/run/) and the tokenizer it reads (apps/text/): the
# CLI, plot and the Python module are not a library a user links.
foreach(room engine autograd optim amp apps/run apps/text)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${room}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/belay/${room}
          FILES_MATCHING PATTERN "*.h")
endforeach()

install(TARGETS belay_core belay_text belay_train belay_package EXPORT belayTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The installed CLI keeps the rpath of the libraries it was linked with outside the build
# tree (the CUDA runtime in /usr/local/cuda/lib is not on every loader path).
set_target_properties(belay PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS belay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(BELAY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/belay)
install(EXPORT belayTargets NAMESPACE belay:: DESTINATION ${BELAY_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/third_party/belayConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/belayConfig.cmake INSTALL_DESTINATION ${BELAY_CMAKE_DIR})
# 0.x: a minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/belayConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/belayConfig.cmake ${CMAKE_BINARY_DIR}/belayConfigVersion.cmake
        DESTINATION ${BELAY_CMAKE_DIR})
