#include "autograd/cast_census.h"

#include "engine/backend.h"
#include "engine/error.h"

namespace belay {

namespace {
thread_local CastCensus* g_cast_census = nullptr;
}  // namespace

bool counted_cast(DType from, DType to) { return from == DType::F32 && (to == DType::F16 || to == DType::BF16); }

CastCensus* active_cast_census() { return g_cast_census; }

CastCensusScope::CastCensusScope(CastCensus* census) : saved_(g_cast_census) { g_cast_census = census; }
CastCensusScope::~CastCensusScope() { g_cast_census = saved_; }

void CastCensus::cast(CastSite kind, const std::string& site, const Tensor& src, Tensor& dst) {
  auto [it, added] = index_[static_cast<int>(kind)].emplace(site, sites_.size());
  if (added) sites_.push_back({kind, site, 0, Tensor::zeros(Shape{kCensusFields}, DType::F32, src.device())});
  Site& s = sites_[it->second];
  if (s.numel + src.numel() > static_cast<int64_t>(UINT32_MAX))
    throw Error("cast census: site '" + site + "' counted more than 2^32 - 1 elements before a read");
  backend_for(src.device()).cast_census(src, dst, s.record);
  s.numel += src.numel();
}

void CastCensus::census_weights(const std::vector<Var>& params) {
  for (const Var& p : params) {
    Node& n = *p.node_ptr();
    if (!n.master.defined() || n.master_released || !counted_cast(n.master.dtype(), n.value.dtype())) continue;
    cast(CastSite::Forward, p.name(), n.master, n.value);
  }
}

CastCensus::Taken CastCensus::take(CastSite kind) {
  Taken out;
  for (Site& s : sites_) {
    if (s.kind != kind) continue;
    out.names.push_back(s.name);
    out.numels.push_back(s.numel);
    out.records.push_back(s.record.clone());
    s.record.fill(0.0f);  // 0.0f: every word's bits 0
    s.numel = 0;
  }
  return out;
}

std::vector<TensorCensus> CastCensus::Taken::decode() const {
  std::vector<uint32_t> words;
  for (const Tensor& r : records) {
    const Tensor host = r.device().is_cpu() ? r : r.to(Device::cpu());
    const uint32_t* w = host.data_as<const uint32_t>();
    words.insert(words.end(), w, w + kCensusFields);
  }
  return decode_census(words, names, numels);
}

Tensor cast_counted(CastCensus* census, CastSite kind, const Tensor& x, DType dtype, const std::string& site) {
  if (!counted_cast(x.dtype(), dtype)) return x.to(dtype);
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  census->cast(kind, site, x, out);
  return out;
}

}  // namespace belay
