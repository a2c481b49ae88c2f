# Installs the public headers under <prefix>/include/fanout/, with their own
# includes rewritten to "fanout/...": a project that includes
# <fanout/runtime/...> never has its own runtime/, models/ or kernels/
# folders mistaken for fanout's. Backend internals (kernels/cpu, kernels/cuda,
# runtime/cuda) are not installed. Run by `cmake --install` with
# FANOUT_SOURCE_DIR and FANOUT_INCLUDEDIR set.
set(dest "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${FANOUT_INCLUDEDIR}/fanout")
file(GLOB_RECURSE headers RELATIVE "${FANOUT_SOURCE_DIR}"
     "${FANOUT_SOURCE_DIR}/runtime/*.h" "${FANOUT_SOURCE_DIR}/kernels/*.h" "${FANOUT_SOURCE_DIR}/models/*.h")
file(REMOVE_RECURSE "${dest}")  # no header of an older install stays behind
foreach(h IN LISTS headers)
  if(h MATCHES "^(kernels/cpu|kernels/cuda|runtime/cuda)/")
    continue()
  endif()
  file(READ "${FANOUT_SOURCE_DIR}/${h}" text)
  string(REGEX REPLACE "#include \"((runtime|kernels|models)/[^\"]+)\"" "#include \"fanout/\\1\"" text "${text}")
  get_filename_component(dir "${dest}/${h}" DIRECTORY)
  file(MAKE_DIRECTORY "${dir}")
  file(WRITE "${dest}/${h}" "${text}")
endforeach()
message(STATUS "Installed the public headers under ${dest}")
