// FlashAttention, step by step — core/npy.cpp
#include "core/npy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fa {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

namespace {

// Writes all `bytes` to fd, retrying short writes and interruptions: "" when done, else the system's reason.
std::string write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::strerror(errno);
    if (n == 0) return "the write made no progress";
    p += n;
    bytes -= size_t(n);
  }
  return "";
}

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": not a usable .npy file: " + why);
}

// Finds the value text that follows 'key': in the header dictionary.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) bad(path, "header has no '" + key + "'");
  const size_t colon = header.find(':', k);
  if (colon == std::string::npos) bad(path, "malformed header");
  size_t b = header.find_first_not_of(' ', colon + 1);
  if (b == std::string::npos) bad(path, "malformed header");
  if (header[b] == '(') {
    const size_t e = header.find(')', b);
    if (e == std::string::npos) bad(path, "malformed shape");
    return header.substr(b, e - b + 1);
  }
  const size_t e = header.find_first_of(",}", b);
  return header.substr(b, e - b);
}

std::string make_header(const char* descr, const std::vector<int64_t>& shape) {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "") + (i + 1 < shape.size() ? " " : "");
  dict += "), }";
  // Pad with spaces so magic (6) + version (2) + length (2) + header ends on a 64-byte boundary, then '\n'.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = uint16_t(dict.size());
  out += char(len & 0xff);
  out += char(len >> 8);
  return out + dict;
}

// The temporary name a file is written under before it is renamed into place: in the same directory (a
// rename within one file system is atomic), and apart from another process writing the same file.
std::string temporary_name(const std::string& path) { return path + ".tmp" + std::to_string(::getpid()); }

// Writes header and data to `tmp` (created or truncated), every byte checked: a short write or a failed close
// (where a full disk can first show, on a network file system) throws, naming `shown` (the file the caller
// asked for) and the system's reason ("No space left on device"); `tmp` is then removed.
void write_raw(const std::string& tmp, const std::string& shown, const std::string& header, const void* data,
               size_t bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw std::runtime_error("cannot write " + shown + ": " + std::strerror(errno));
  std::string why = write_all(fd, header.data(), header.size());
  if (why.empty()) why = write_all(fd, data, bytes);
  if (::close(fd) != 0 && why.empty()) why = std::strerror(errno);
  if (!why.empty()) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + shown + ": " + why);
  }
}

// Writes `path` whole or not at all: to a temporary name first, renamed into place once every byte is written.
void write_whole(const std::string& path, const std::string& header, const void* data, size_t bytes) {
  const std::string tmp = temporary_name(path);
  write_raw(tmp, path, header, data, bytes);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + why);
  }
}

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open file");
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) bad(path, "missing the \\x93NUMPY magic");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char l[2];
    if (!f.read(reinterpret_cast<char*>(l), 2)) bad(path, "truncated header");
    hlen = l[0] | (uint32_t(l[1]) << 8);
  } else if (major == 2 || major == 3) {
    unsigned char l[4];
    if (!f.read(reinterpret_cast<char*>(l), 4)) bad(path, "truncated header");
    hlen = l[0] | (uint32_t(l[1]) << 8) | (uint32_t(l[2]) << 16) | (uint32_t(l[3]) << 24);
  } else {
    bad(path, "unsupported format version " + std::to_string(major));
  }
  if (hlen > (1u << 20)) bad(path, "header too long");
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) bad(path, "truncated header");

  const std::string descr = dict_value(header, "descr", path);
  if (descr != "'<f4'")
    bad(path, "dtype is " + descr + ", expected little-endian float32 ('<f4'); convert with x.astype('<f4')");
  if (dict_value(header, "fortran_order", path) != "False") bad(path, "Fortran order is not supported; save with C order");

  Tensor t;
  const std::string sh = dict_value(header, "shape", path);
  std::string inner = sh.substr(1, sh.size() - 2);
  std::stringstream ss(inner);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    try {
      size_t used = 0;
      const long long v = std::stoll(item.substr(b), &used);
      if (v < 0) bad(path, "negative dimension in shape " + sh);
      t.shape.push_back(v);
    } catch (const std::logic_error&) {
      bad(path, "malformed shape " + sh);
    }
  }
  // The file's size is checked against the shape before any memory is set aside for the data, so that a
  // corrupt header costs a message rather than an allocation of whatever size it claims.
  double promised = 1;
  for (const int64_t e : t.shape) promised *= double(e);
  const std::streamoff data_start = f.tellg();
  f.seekg(0, std::ios::end);
  const double held = double(f.tellg() - data_start) / sizeof(float);
  f.seekg(data_start);
  if (held < promised)
    bad(path, "file holds " + std::to_string(size_t(held)) + " floats, fewer than its shape " + sh + " promises");
  if (held > promised) bad(path, "file holds more data than its shape " + sh + " promises");
  const size_t n = TensorT<float>::count(t.shape);
  t.data.resize(n);
  if (!f.read(reinterpret_cast<char*>(t.data.data()), std::streamsize(n * sizeof(float))))
    bad(path, "read failed after the header");
  return t;
}

void write_npy(const std::string& path, const Tensor& t) {
  write_whole(path, make_header("<f4", t.shape), t.data.data(), t.data.size() * sizeof(float));
}

void write_npy_u8(const std::string& path, const std::vector<int64_t>& shape, const std::vector<uint8_t>& data) {
  write_whole(path, make_header("|u1", shape), data.data(), data.size());
}

void AtomicFileSet::add_f32(const std::string& path, const Tensor& t) {
  tmp_.push_back(temporary_name(path));
  final_.push_back(path);
  write_raw(tmp_.back(), path, make_header("<f4", t.shape), t.data.data(), t.data.size() * sizeof(float));
}

void AtomicFileSet::add_u8(const std::string& path, const std::vector<int64_t>& shape, const std::vector<uint8_t>& d) {
  tmp_.push_back(temporary_name(path));
  final_.push_back(path);
  write_raw(tmp_.back(), path, make_header("|u1", shape), d.data(), d.size());
}

void AtomicFileSet::commit() {
  for (size_t i = 0; i < tmp_.size(); ++i)
    if (std::rename(tmp_[i].c_str(), final_[i].c_str()) != 0)
      throw std::runtime_error("cannot write " + final_[i] + ": " + std::strerror(errno));
  tmp_.clear();
  final_.clear();
}

AtomicFileSet::~AtomicFileSet() {
  for (const auto& t : tmp_) std::remove(t.c_str());
}

}  // namespace fa
