// TensorBoard event files written by belay itself (no TensorFlow, no protobuf library): the
// TFRecord framing (length, masked CRC-32C of the length, the record, its masked CRC-32C)
// around Event messages, each a wall time, a step and a Summary of simple_value scalars,
// encoded by hand (the five protobuf fields TensorBoard's scalar reader looks at).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace belay {

uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);  // TFRecord's: rotated right by 15 plus a constant

// One Event message: wall_time (field 1, double), step (2, int64), and either file_version
// (3, string) or a Summary (5) of values {tag (1), simple_value (2, float)}.
std::string event_message(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars,
                          const std::string& file_version = "");
std::string tfrecord(const std::string& data);

class TensorBoardWriter {
 public:
  // Creates DIR (and parents) and DIR/events.out.tfevents.<seconds>.belay, starting with the
  // version event TensorBoard expects; UsageError naming the directory when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);  // flushed
  const std::string& path() const { return path_; }
  void close();

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace belay
