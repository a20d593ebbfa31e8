# Checks the ABI surface of the built libember.so against the committed list
# (capi/ember.symbols) and its SONAME, so the ABI cannot change by accident.
#
#   cmake -DNM=nm -DREADELF=readelf -DLIB=libember.so.1.0.0 \
#         -DEXPECTED=capi/ember.symbols -DSONAME=libember.so.1 -P check_symbols.cmake
#
# After an intended ABI change (a new function), regenerate the list with
# -DUPDATE=ON and commit it with the header change.
cmake_minimum_required(VERSION 3.20)
foreach(var NM LIB EXPECTED)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_symbols.cmake: -D${var}=... is required")
  endif()
endforeach()

execute_process(COMMAND ${NM} -D --defined-only ${LIB}
  OUTPUT_VARIABLE nm_out ERROR_VARIABLE nm_err RESULT_VARIABLE nm_rc)
if(NOT nm_rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIB} failed (${nm_rc}): ${nm_err}")
endif()

# Lines are "VALUE TYPE NAME[@[@]VERSION]". Uppercase types (and 'u', GNU
# unique) are global. The version node itself ("A EMBER_1") is not a symbol
# of the API; versions are stripped so the check does not depend on whether
# this nm prints them.
string(REPLACE "\n" ";" lines "${nm_out}")
set(actual)
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) ([^ @]+)")
    set(type "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    if(NOT type MATCHES "^[A-Zu]$")
      continue()
    endif()
    if(type STREQUAL "A" AND name MATCHES "^EMBER_[0-9]+$")
      continue()
    endif()
    list(APPEND actual "${name}")
  endif()
endforeach()
list(REMOVE_DUPLICATES actual)
list(SORT actual)
list(JOIN actual "\n" actual_text)
set(actual_text "${actual_text}\n")

if(UPDATE)
  file(WRITE ${EXPECTED} "${actual_text}")
  list(LENGTH actual n)
  message(STATUS "wrote ${n} symbols to ${EXPECTED}")
  return()
endif()

file(READ ${EXPECTED} expected_text)
set(failed FALSE)
if(NOT actual_text STREQUAL expected_text)
  set(failed TRUE)
  string(REPLACE "\n" ";" expected "${expected_text}")
  list(FILTER expected EXCLUDE REGEX "^$")
  set(added ${actual})
  list(REMOVE_ITEM added ${expected})
  set(removed ${expected})
  list(REMOVE_ITEM removed ${actual})
  set(diff "")
  foreach(s IN LISTS removed)
    string(APPEND diff "  - ${s}   (in ${EXPECTED}, not exported)\n")
  endforeach()
  foreach(s IN LISTS added)
    string(APPEND diff "  + ${s}   (exported, not in ${EXPECTED})\n")
  endforeach()
  if(diff STREQUAL "")
    set(diff "  (same symbols; the committed file is not sorted or has stray lines)\n")
  endif()
  message(SEND_ERROR "the exported symbols of ${LIB} differ from ${EXPECTED}:\n${diff}"
                     "If the change is intended, rerun this script with -DUPDATE=ON and commit the list.")
endif()

if(DEFINED SONAME AND NOT SONAME STREQUAL "")
  if(NOT READELF)
    message(FATAL_ERROR "check_symbols.cmake: -DREADELF=... is required to check the SONAME")
  endif()
  execute_process(COMMAND ${READELF} -d ${LIB} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT dyn MATCHES "\\(SONAME\\)[^\n]*\\[([^]\n]*)\\]")
    set(failed TRUE)
    message(SEND_ERROR "${LIB} has no SONAME")
  elseif(NOT CMAKE_MATCH_1 STREQUAL SONAME)
    set(failed TRUE)
    message(SEND_ERROR "${LIB} has SONAME ${CMAKE_MATCH_1}, expected ${SONAME}")
  endif()
endif()

if(failed)
  message(FATAL_ERROR "ABI check failed")
endif()
list(LENGTH actual n)
message(STATUS "ABI check passed: ${n} symbols, SONAME ${SONAME}")
