#include "apps/plot/svg.h"

#include <cstdio>

namespace belay {

namespace {

std::string n(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string style_attrs(const SvgStyle& s) {
  std::string a = " stroke=\"" + xml_escape(s.stroke) + "\" stroke-width=\"" + n(s.width) + "\" fill=\"" +
                  xml_escape(s.fill) + "\"";
  if (!s.dash.empty()) a += " stroke-dasharray=\"" + xml_escape(s.dash) + "\"";
  if (s.opacity < 1.0) a += " opacity=\"" + n(s.opacity) + "\"";
  return a;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text: drop them.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::line(double x1, double y1, double x2, double y2, const SvgStyle& style) {
  body_ += "<line x1=\"" + n(x1) + "\" y1=\"" + n(y1) + "\" x2=\"" + n(x2) + "\" y2=\"" + n(y2) + "\"" +
           style_attrs(style) + "/>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points, const SvgStyle& style) {
  if (points.size() < 2) return;
  body_ += "<polyline points=\"";
  for (size_t i = 0; i < points.size(); ++i) body_ += (i ? " " : "") + n(points[i].first) + "," + n(points[i].second);
  body_ += "\"" + style_attrs(style) + " stroke-linejoin=\"round\"/>\n";
}

void Svg::rect(double x, double y, double w, double h, const SvgStyle& style) {
  body_ += "<rect x=\"" + n(x) + "\" y=\"" + n(y) + "\" width=\"" + n(w) + "\" height=\"" + n(h) + "\"" +
           style_attrs(style) + "/>\n";
}

void Svg::circle(double cx, double cy, double r, const SvgStyle& style) {
  body_ += "<circle cx=\"" + n(cx) + "\" cy=\"" + n(cy) + "\" r=\"" + n(r) + "\"" + style_attrs(style) + "/>\n";
}

void Svg::text(double x, double y, const std::string& s, double size, const std::string& anchor,
               const std::string& color, double rotate) {
  body_ += "<text x=\"" + n(x) + "\" y=\"" + n(y) + "\" font-size=\"" + n(size) + "\" text-anchor=\"" +
           xml_escape(anchor) + "\" fill=\"" + xml_escape(color) + "\"";
  if (rotate != 0) body_ += " transform=\"rotate(" + n(rotate) + " " + n(x) + " " + n(y) + ")\"";
  body_ += ">" + xml_escape(s) + "</text>\n";
}

void Svg::power_text(double x, double y, const std::string& base, int exponent, double size, const std::string& anchor) {
  body_ += "<text x=\"" + n(x) + "\" y=\"" + n(y) + "\" font-size=\"" + n(size) + "\" text-anchor=\"" +
           xml_escape(anchor) + "\" fill=\"#222\">" + xml_escape(base) + "<tspan dy=\"-" + n(size * 0.4) +
           "\" font-size=\"" + n(size * 0.75) + "\">" + std::to_string(exponent) + "</tspan></text>\n";
}

std::string Svg::str() const {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + n(width_) +
         "\" height=\"" + n(height_) + "\" viewBox=\"0 0 " + n(width_) + " " + n(height_) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n" +
         body_ + "</svg>\n";
}

}  // namespace belay
