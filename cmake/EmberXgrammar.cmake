# Structured output (core/grammar) runs on XGrammar, built here from its
# pinned source (tools/fetch_xgrammar.sh puts it in
# $EMBER_HOME/deps/xgrammar-<version>; tools/setup.sh runs it) as a static
# library with Ember's compiler and sanitizer flags. EMBER_WITH_XGRAMMAR:
# AUTO (default) builds it when the source is there, ON requires it, OFF
# leaves it out (constrained streams then fail with UNSUPPORTED).
set(EMBER_WITH_XGRAMMAR "AUTO" CACHE STRING "Structured output with XGrammar: AUTO, ON or OFF")
set(EMBER_XGRAMMAR_VERSION 0.2.8)
if(DEFINED ENV{EMBER_HOME})
  set(_ember_home "$ENV{EMBER_HOME}")
else()
  set(_ember_home "$ENV{HOME}/.cache/ember")
endif()
set(EMBER_XGRAMMAR_SOURCE "${_ember_home}/deps/xgrammar-${EMBER_XGRAMMAR_VERSION}"
    CACHE PATH "XGrammar's source (tools/fetch_xgrammar.sh)")
set(EMBER_HAVE_XGRAMMAR OFF)
if(NOT EMBER_WITH_XGRAMMAR STREQUAL "OFF")
  if(EXISTS "${EMBER_XGRAMMAR_SOURCE}/include/xgrammar/xgrammar.h")
    file(GLOB_RECURSE _xg_srcs CONFIGURE_DEPENDS "${EMBER_XGRAMMAR_SOURCE}/cpp/*.cc")
    list(FILTER _xg_srcs EXCLUDE REGEX "/cpp/(tvm_ffi|nanobind)/")
    add_library(ember_xgrammar STATIC ${_xg_srcs})
    set_target_properties(ember_xgrammar PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                          POSITION_INDEPENDENT_CODE ON)
    target_include_directories(ember_xgrammar PUBLIC "${EMBER_XGRAMMAR_SOURCE}/include")
    target_include_directories(ember_xgrammar SYSTEM PUBLIC "${EMBER_XGRAMMAR_SOURCE}/3rdparty/picojson"
                               "${EMBER_XGRAMMAR_SOURCE}/3rdparty/dlpack/include")
    target_compile_definitions(ember_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
    # Its own code, not ours: no warnings (EMBER_WERROR stays on for Ember).
    target_compile_options(ember_xgrammar PRIVATE -w)
    set(EMBER_HAVE_XGRAMMAR ON)
    message(STATUS "Structured output: XGrammar ${EMBER_XGRAMMAR_VERSION} from ${EMBER_XGRAMMAR_SOURCE}")
  elseif(EMBER_WITH_XGRAMMAR STREQUAL "ON")
    message(FATAL_ERROR "EMBER_WITH_XGRAMMAR=ON but ${EMBER_XGRAMMAR_SOURCE} has no XGrammar source "
                        "(run tools/fetch_xgrammar.sh)")
  else()
    message(STATUS "Structured output: off (no XGrammar source at ${EMBER_XGRAMMAR_SOURCE}; tools/fetch_xgrammar.sh)")
  endif()
endif()
