# What `cmake --install build [--prefix DIR]` puts in place:
#   lib/libember.so*                      the C ABI (and libember_cuda.so when built, gpu/)
#   include/ember/ember.h, ember.hpp      the public headers
#   bin/ember                             the CLI
#   lib/cmake/Ember/                      find_package(Ember) -> imported target Ember::ember
#   lib/pkgconfig/ember.pc                pkg-config --cflags --libs ember
# The package version is the ABI's (EMBER_VERSION_* in ember.h), as the
# SONAME's. tests/install/install_test.sh installs into a temporary prefix and
# builds examples/c against it both ways.
include(CMakePackageConfigHelpers)

set(EMBER_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)

install(TARGETS ember EXPORT EmberTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ember DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The CLI finds the installed libember through a relative RPATH, so the
# installed tree can be moved.
if(NOT IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" AND NOT IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  file(RELATIVE_PATH _ember_bin_to_lib "/${CMAKE_INSTALL_BINDIR}" "/${CMAKE_INSTALL_LIBDIR}")
  set_target_properties(ember_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_ember_bin_to_lib}")
else()
  set_target_properties(ember_cli PROPERTIES INSTALL_RPATH "${CMAKE_INSTALL_FULL_LIBDIR}")
endif()
install(TARGETS ember_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# find_package(Ember [1.1]): Ember::ember, a shared library whose engine
# dependencies (oneDNN, OpenMP) are private, so the config needs nothing else.
install(EXPORT EmberTargets NAMESPACE Ember:: DESTINATION ${EMBER_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/EmberConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/EmberConfig.cmake INSTALL_DESTINATION ${EMBER_INSTALL_CMAKEDIR})
# A library of ABI 1.x serves every program written for 1.y with y <= x.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/EmberConfigVersion.cmake
  VERSION ${EMBER_ABI_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/EmberConfig.cmake ${PROJECT_BINARY_DIR}/cmake/EmberConfigVersion.cmake
  DESTINATION ${EMBER_INSTALL_CMAKEDIR})

# ember.pc locates the tree from its own place (${pcfiledir}), so it is right
# for `cmake --install --prefix` at any prefix and after the tree is moved.
if(NOT IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" AND NOT IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  file(RELATIVE_PATH _ember_pc_to_prefix "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
  string(REGEX REPLACE "/$" "" _ember_pc_to_prefix "${_ember_pc_to_prefix}")
  set(EMBER_PC_PREFIX "\${pcfiledir}/${_ember_pc_to_prefix}")
  set(EMBER_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(EMBER_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(EMBER_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(EMBER_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(EMBER_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/ember.pc.in ${PROJECT_BINARY_DIR}/cmake/ember.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/ember.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
