# How a backend folder declares itself to the build.
#
# Each folder src/backends/<name> named in CUBE_BACKENDS has a CMakeLists.txt
# that calls, once:
#
#   cube_register_backend(<name>
#                         SOURCES <file>...        its .c files
#                         [PRELUDE <file>])        its cube C prelude
#
# The sources join the library's objects. The prelude is embedded into the
# library as cube_prelude_<name> (cmake/embed.cmake). The registration says
# that the folder defines `const cube_backend cube_backend_<name>` (the name
# in that struct is <name> too): the registry table the library is built
# with lists exactly the backends registered here (cube_registry_write).
#
# src/backends/common registers nothing: it adds the code and the prelude
# every backend shares with cube_backend_common().

# Relative paths are taken from the calling folder.
function(_cube_absolute out)
  set(files "")
  foreach(f ${ARGN})
    get_filename_component(f "${f}" ABSOLUTE
                           BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND files "${f}")
  endforeach()
  set(${out} "${files}" PARENT_SCOPE)
endfunction()

function(cube_register_backend name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PRELUDE" "SOURCES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR
            "cube_register_backend(${name}): unexpected ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT name MATCHES "^[a-z][a-z0-9_]*$")
    message(FATAL_ERROR "cube_register_backend: '${name}' is not a C identifier "
                        "in lower case")
  endif()
  get_filename_component(folder "${CMAKE_CURRENT_SOURCE_DIR}" NAME)
  if(NOT folder STREQUAL name)
    message(FATAL_ERROR "cube_register_backend(${name}) is called from "
                        "${CMAKE_CURRENT_SOURCE_DIR}, not src/backends/${name}")
  endif()
  get_property(done GLOBAL PROPERTY CUBE_REGISTERED_BACKENDS)
  if(name IN_LIST done)
    message(FATAL_ERROR "cube_register_backend(${name}) is called twice")
  endif()
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "cube_register_backend(${name}): no SOURCES")
  endif()
  _cube_absolute(sources ${arg_SOURCES})
  set_property(GLOBAL APPEND PROPERTY CUBE_REGISTERED_BACKENDS ${name})
  set_property(GLOBAL APPEND PROPERTY CUBE_BACKEND_SOURCES ${sources})
  if(arg_PRELUDE)
    _cube_absolute(prelude ${arg_PRELUDE})
    set_property(GLOBAL APPEND PROPERTY CUBE_PRELUDE_NAMES ${name})
    set_property(GLOBAL APPEND PROPERTY CUBE_PRELUDE_FILES ${prelude})
  endif()
endfunction()

# The code every backend shares (not a backend: nothing is registered).
function(cube_backend_common)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "PRELUDE" "SOURCES")
  _cube_absolute(sources ${arg_SOURCES})
  _cube_absolute(prelude ${arg_PRELUDE})
  set_property(GLOBAL APPEND PROPERTY CUBE_BACKEND_SOURCES ${sources})
  set_property(GLOBAL APPEND PROPERTY CUBE_PRELUDE_NAMES common)
  set_property(GLOBAL APPEND PROPERTY CUBE_PRELUDE_FILES ${prelude})
endfunction()

# Writes the registry table, a C file, to `out`: the backends registered in
# this build, in the order of CUBE_BACKENDS, and the names in `known` that
# this build left out (so that asking for one says so, rather than "no such
# backend"). Rewritten only when its text changes.
function(cube_registry_write out known)
  get_property(built GLOBAL PROPERTY CUBE_REGISTERED_BACKENDS)
  set(externs "")
  set(table "")
  set(names "")
  set(left_out "")
  foreach(b ${known})
    if(b IN_LIST built)
      string(APPEND externs "extern const cube_backend cube_backend_${b};\n")
      string(APPEND table "    &cube_backend_${b},\n")
      string(APPEND names "    \"${b}\",\n")
    else()
      string(APPEND left_out "    \"${b}\",\n")
    endif()
  endforeach()
  foreach(b ${built})
    if(NOT b IN_LIST known)
      message(FATAL_ERROR "backend ${b} is registered but not in CUBE_BACKENDS")
    endif()
  endforeach()
  set(CUBE_REGISTRY_EXTERNS "${externs}")
  set(CUBE_REGISTRY_TABLE "${table}")
  set(CUBE_REGISTRY_NAMES "${names}")
  set(CUBE_REGISTRY_LEFT_OUT "${left_out}")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/registry_table.c.in" "${out}"
                 @ONLY)
endfunction()
