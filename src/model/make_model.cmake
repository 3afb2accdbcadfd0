# The random-weight model writer (deepinfer make-model). Kept apart from di_model (the loader and
# the architectures) so either builds without the other.
di_library(di_model_writer
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_writer.cpp ${CMAKE_CURRENT_LIST_DIR}/make_model.cpp
  DEPS di_core di_tensor nlohmann_json::nlohmann_json)
