// A small SVG writer for `belay plot`: lines, polylines, rectangles, circles and text, with every
// number written in fixed notation and every string XML-escaped, so the output is well
// formed whatever the data or the file names. Why our own and not PLplot: see apps/plot/plot.h.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace belay {

struct SvgStyle {
  std::string stroke = "#000";
  double width = 1.0;
  std::string dash;          // e.g. "4 3"; empty: solid
  std::string fill = "none";
  double opacity = 1.0;
};

class Svg {
 public:
  Svg(double width, double height);
  void line(double x1, double y1, double x2, double y2, const SvgStyle& style);
  void polyline(const std::vector<std::pair<double, double>>& points, const SvgStyle& style);
  void rect(double x, double y, double w, double h, const SvgStyle& style);
  void circle(double cx, double cy, double r, const SvgStyle& style);
  // anchor: start | middle | end. rotate: degrees about (x, y).
  void text(double x, double y, const std::string& s, double size = 11, const std::string& anchor = "start",
            const std::string& color = "#222", double rotate = 0);
  // A number as a base and an exponent ("2" with a raised "16").
  void power_text(double x, double y, const std::string& base, int exponent, double size, const std::string& anchor);
  std::string str() const;  // the whole document

 private:
  double width_, height_;
  std::string body_;
};

std::string xml_escape(const std::string& s);

}  // namespace belay
