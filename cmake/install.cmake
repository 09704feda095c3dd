# Install rules and the relocatable CMake package:
#   <prefix>/lib/liborthopt_core.so.0.1.0 (+ .so.0.1, .so), liborthopt_train.so.*
#   <prefix>/include/orthopt/*.h, orthopt/version.h, orthopt/train/*.h
#   <prefix>/bin/orthopt
#   <prefix>/lib/cmake/orthopt/orthoptConfig.cmake, ...ConfigVersion.cmake, orthoptTargets.cmake
# Consumers: find_package(orthopt 0.1 REQUIRED [COMPONENTS train]) and link orthopt::core or
# orthopt::train (docs/install.md).
include(CMakePackageConfigHelpers)
set(ORTHOPT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/orthopt)

# The static CUDA kernel library (orthopt_kernels) is linked into liborthopt_core.so: not installed,
# not part of any target's link interface.
set(ORTHOPT_INSTALL_TARGETS orthopt_core)
if(ORTHOPT_BUILD_TRAIN)
  list(APPEND ORTHOPT_INSTALL_TARGETS orthopt_train)
endif()
install(TARGETS ${ORTHOPT_INSTALL_TARGETS} EXPORT orthoptTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(ORTHOPT_BUILD_TRAIN)
  install(TARGETS orthopt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()

# Public headers: the train ones only with the train library.
set(ORTHOPT_HEADER_EXCLUDE)
if(NOT ORTHOPT_BUILD_TRAIN)
  set(ORTHOPT_HEADER_EXCLUDE PATTERN train EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/orthopt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
        FILES_MATCHING PATTERN "*.h" ${ORTHOPT_HEADER_EXCLUDE})
install(FILES ${ORTHOPT_GENERATED_INCLUDE_DIR}/orthopt/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/orthopt COMPONENT dev)

install(EXPORT orthoptTargets NAMESPACE orthopt:: DESTINATION ${ORTHOPT_CMAKE_DIR} COMPONENT dev)
# Where torch was found at build time: the package's default if the consumer names none.
set(ORTHOPT_TORCH_DIR_HINT "${Torch_DIR}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/orthoptConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/orthoptConfig.cmake
                              INSTALL_DESTINATION ${ORTHOPT_CMAKE_DIR})
# 0.x: a new minor version may break the API, so only 0.1.z satisfies find_package(orthopt 0.1).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/orthoptConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/orthoptConfig.cmake ${PROJECT_BINARY_DIR}/orthoptConfigVersion.cmake
        DESTINATION ${ORTHOPT_CMAKE_DIR} COMPONENT dev)
