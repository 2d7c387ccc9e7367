// Opening the text files belay reads (step logs, census files, tokenizer files, text to
// tokenize): one check and one message where a path cannot be read or names a directory (which
// std::ifstream opens, and then reads as an empty file).
#pragma once
#include <fstream>
#include <istream>
#include <string>

namespace belay {

// `path` open for reading, or a UsageError naming `what` and the path: "cannot read census file
// 'x': No such file or directory", "census file 'x' is a directory". A pipe or FIFO (a shell's
// <(...)) opens as a file does.
std::ifstream open_text_file(const std::string& path, const std::string& what);

// The whole of the file open_text_file opens.
std::string read_text_file(const std::string& path, const std::string& what);

// std::getline without the '\r' a CRLF file ends its lines with.
bool read_text_line(std::istream& in, std::string& line);

}  // namespace belay
