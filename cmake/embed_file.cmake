# Writes a C++ header holding one file as `constexpr std::string_view NAME`, in a
# raw string literal. Run as a script:
#   cmake -DINPUT=web/index.html -DOUTPUT=gen/web_assets.h -DNAME=kIndexHtml -P cmake/embed_file.cmake
foreach(var INPUT OUTPUT NAME)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_file.cmake: -D${var}=... is required")
  endif()
endforeach()

file(READ "${INPUT}" content)
set(delim "kettle_embed")
string(FIND "${content}" ")${delim}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "embed_file.cmake: ${INPUT} contains the raw-string delimiter )${delim}\"")
endif()

get_filename_component(source_name "${INPUT}" NAME)
set(header "// Generated from ${source_name} by cmake/embed_file.cmake; do not edit.\n#pragma once\n\n#include <string_view>\n\nnamespace kettle::web {\n\ninline constexpr std::string_view ${NAME} = R\"${delim}(${content})${delim}\";\n\n}  // namespace kettle::web\n")

# Leave an unchanged header alone so nothing that includes it rebuilds.
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
  if(old STREQUAL header)
    return()
  endif()
endif()
file(WRITE "${OUTPUT}" "${header}")
