// FlashAttention, step by step — core/npy.h
// Reading and writing NumPy's .npy format (version 1.0/2.0 headers): little-endian float32 in C order
// for tensors, uint8 for the dropout mask. Writes go to a temporary name and are renamed into place, so
// a file is there whole or not at all.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fa {

// Throws std::runtime_error naming the file and what is wrong with it. A write that cannot be completed (a
// full disk) leaves no file and keeps what was there: "cannot write DIR/o.npy: No space left on device".
Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const Tensor& t);
void write_npy_u8(const std::string& path, const std::vector<int64_t>& shape, const std::vector<uint8_t>& data);

// Writes several files so that either all of them appear or none: each goes to a temporary name in its
// directory first ("<name>.tmp<pid>"), and only when every write succeeded are they renamed into place.
class AtomicFileSet {
 public:
  void add_f32(const std::string& path, const Tensor& t);
  void add_u8(const std::string& path, const std::vector<int64_t>& shape, const std::vector<uint8_t>& data);
  void commit();  // renames all; on any error removes every temporary and throws
  ~AtomicFileSet();

 private:
  std::vector<std::string> tmp_, final_;
};

}  // namespace fa
