#include "gpu_clock.h"

#include <dlfcn.h>
#include <fmt/format.h>
#ifdef ORTHOPT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "timing.h"

namespace orthopt::bench {

namespace {

// The few NVML declarations used here, as in nvml.h (not included: CI has no NVML header): an
// opaque device handle, int return codes (nvmlReturn_t), 0 = NVML_SUCCESS.
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr int kNvmlClockSm = 1;                              // NVML_CLOCK_SM
constexpr unsigned long long kNvmlReasonSwPowerCap = 0x4ULL;  // nvmlClocksEventReasonSwPowerCap

struct Nvml {
  std::string error;  // why NVML is unusable; empty when loaded and initialized
  int (*get_handle_by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  int (*get_clock_info)(nvmlDevice_t, int, unsigned int*) = nullptr;
  int (*get_power_usage)(nvmlDevice_t, unsigned int*) = nullptr;          // optional; milliwatts
  int (*get_event_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;  // optional
  const char* (*error_string)(int) = nullptr;                             // optional

  std::string describe(const char* call, int code) const {
    const char* s = error_string ? error_string(code) : nullptr;
    return s ? fmt::format("{}: code {} ({})", call, code, s) : fmt::format("{}: code {}", call, code);
  }
};

template <typename Fn>
void load_symbol(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
}

Nvml load_nvml() {
  Nvml n;
  // Never dlclose'd: the function pointers live as long as the process.
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    n.error = "libnvidia-ml.so.1 not found";
    return n;
  }
  int (*init)() = nullptr;
  load_symbol(lib, "nvmlInit_v2", &init);
  load_symbol(lib, "nvmlDeviceGetHandleByPciBusId_v2", &n.get_handle_by_pci_bus_id);
  load_symbol(lib, "nvmlDeviceGetClockInfo", &n.get_clock_info);
  load_symbol(lib, "nvmlDeviceGetPowerUsage", &n.get_power_usage);
  // The newer name of ...ThrottleReasons (same bits); older drivers export only the old one.
  load_symbol(lib, "nvmlDeviceGetCurrentClocksEventReasons", &n.get_event_reasons);
  if (!n.get_event_reasons) load_symbol(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", &n.get_event_reasons);
  load_symbol(lib, "nvmlErrorString", &n.error_string);
  const char* missing = !init                          ? "nvmlInit_v2"
                        : !n.get_handle_by_pci_bus_id ? "nvmlDeviceGetHandleByPciBusId_v2"
                        : !n.get_clock_info           ? "nvmlDeviceGetClockInfo"
                                                      : nullptr;
  if (missing) {
    n.error = fmt::format("libnvidia-ml.so.1 lacks {}", missing);
    return n;
  }
  if (const int rc = init(); rc != 0) n.error = n.describe("NVML init failed", rc);
  return n;
}

// One NVML per process, initialized on first use. Never shut down: nvmlShutdown invalidates the
// handles of every sampler in the process, and one may be sampling on another thread; the
// driver releases NVML at exit.
const Nvml& nvml() {
  static const Nvml n = load_nvml();
  return n;
}

// The PCI bus id of a CUDA device ("0000:3B:00.0"), which NVML also knows it by: CUDA's device
// indices follow CUDA_VISIBLE_DEVICES and CUDA's ordering, NVML's do not. Empty, with *why_not
// set, when the device is not a CUDA device of this build.
std::string pci_bus_id(c10::Device device, std::string* why_not) {
  if (!device.is_cuda()) {
    *why_not = "not a CUDA device";
    return {};
  }
#ifdef ORTHOPT_WITH_CUDA
  int index = device.index();
  if (index < 0) {
    if (const cudaError_t rc = cudaGetDevice(&index); rc != cudaSuccess) {
      *why_not = fmt::format("cudaGetDevice failed: {}", cudaGetErrorString(rc));
      return {};
    }
  }
  char id[64] = {};
  if (const cudaError_t rc = cudaDeviceGetPCIBusId(id, sizeof id, index); rc != cudaSuccess) {
    *why_not = fmt::format("cudaDeviceGetPCIBusId failed for device {}: {}", index, cudaGetErrorString(rc));
    return {};
  }
  return id;
#else
  *why_not = "this build has no CUDA";
  return {};
#endif
}

// A reader of the device's NVML, or an empty one with *why_not set.
ClockReader nvml_reader(c10::Device device, std::string* why_not) {
  const std::string bus_id = pci_bus_id(device, why_not);
  if (bus_id.empty()) return {};
  const Nvml& n = nvml();
  if (!n.error.empty()) {
    *why_not = n.error;
    return {};
  }
  nvmlDevice_t handle = nullptr;
  if (const int rc = n.get_handle_by_pci_bus_id(bus_id.c_str(), &handle); rc != 0) {
    *why_not = n.describe(fmt::format("nvmlDeviceGetHandleByPciBusId_v2({})", bus_id).c_str(), rc);
    return {};
  }
  return [&n, handle](ClockReading* r, std::string* error) {
    unsigned int mhz = 0;
    if (const int rc = n.get_clock_info(handle, kNvmlClockSm, &mhz); rc != 0) {
      *error = n.describe("nvmlDeviceGetClockInfo", rc);
      return false;
    }
    r->sm_mhz = mhz;
    unsigned int mw = 0;
    if (n.get_power_usage && n.get_power_usage(handle, &mw) == 0) r->power_w = mw / 1000.0;
    unsigned long long reasons = 0;
    if (n.get_event_reasons && n.get_event_reasons(handle, &reasons) == 0)
      r->power_cap = (reasons & kNvmlReasonSwPowerCap) ? 1 : 0;
    return true;
  };
}

ClockSummary summarize(const std::vector<ClockReading>& readings, const std::string& last_error) {
  ClockSummary s;
  if (readings.empty()) {
    s.why_not = last_error.empty() ? "no samples" : "no samples: " + last_error;
    return s;
  }
  s.sampled = true;
  s.samples = static_cast<int>(readings.size());
  std::vector<double> mhz, watts;
  int capped = 0, reasons_read = 0;
  for (const auto& r : readings) {
    mhz.push_back(r.sm_mhz);
    if (!std::isnan(r.power_w)) watts.push_back(r.power_w);
    if (r.power_cap >= 0) {
      ++reasons_read;
      capped += r.power_cap;
    }
  }
  s.sm_mhz_median = median(mhz);
  s.sm_mhz_min = *std::min_element(mhz.begin(), mhz.end());
  if (reasons_read > 0) s.power_cap_fraction = static_cast<double>(capped) / reasons_read;
  if (!watts.empty()) s.power_w_median = median(watts);
  return s;
}

nlohmann::json number_or_null(double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); }

}  // namespace

std::string ClockSummary::line() const {
  if (!sampled) return fmt::format("  timed rounds: clock not sampled ({})", why_not);
  const std::string cap = std::isnan(power_cap_fraction)
                              ? fmt::format("power cap not read in {} samples", samples)
                              : fmt::format("power cap in {:.0f}% of {} samples", 100.0 * power_cap_fraction, samples);
  const std::string power = std::isnan(power_w_median) ? "power not read" : fmt::format("{:.0f} W median", power_w_median);
  return fmt::format("  timed rounds: SM clock {:.0f} MHz median (min {:.0f}), {}, {}", sm_mhz_median, sm_mhz_min, cap,
                     power);
}

nlohmann::json ClockSummary::to_json() const {
  if (!sampled) return {{"sampled", false}, {"why_not", why_not}};
  return {{"sampled", true},
          {"samples", samples},
          {"sm_mhz_median", number_or_null(sm_mhz_median)},
          {"sm_mhz_min", number_or_null(sm_mhz_min)},
          {"power_cap_fraction", number_or_null(power_cap_fraction)},
          {"power_w_median", number_or_null(power_w_median)}};
}

std::string ClockSummary::legend() {
  return fmt::format(
      "timed rounds: the SM clock (NVML, every {} ms) while the rows above it were timed; power cap: share\n"
      "of the samples in which the board held its clock down to stay under its power limit.\n",
      kClockPeriod.count());
}

// NVML is loaded and the device looked up here, not in start(): the first load takes a moment,
// during which the GPU would idle between a benchmark's warm-up and its timed rounds.
ClockSampler::ClockSampler(c10::Device device, std::chrono::milliseconds period)
    : reader_(nvml_reader(device, &unavailable_)), period_(period) {}

ClockSampler::ClockSampler(ClockReader reader, std::chrono::milliseconds period)
    : reader_(std::move(reader)), period_(period) {}

ClockSampler::~ClockSampler() { join(); }

void ClockSampler::start() {
  if (started_) throw std::logic_error("ClockSampler::start: already started");
  started_ = true;
  why_not_.clear();
  readings_.clear();
  last_error_.clear();
  thread_error_.clear();
  stop_requested_ = false;
  if (!reader_) {
    why_not_ = unavailable_.empty() ? "no clock reader" : unavailable_;
    return;
  }
  thread_ = std::thread([this] { sample_loop(); });
}

void ClockSampler::join() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

ClockSummary ClockSampler::stop() {
  ClockSummary s;
  if (!started_) {
    s.why_not = "sampler not started";
    return s;
  }
  started_ = false;
  join();
  // Samples of a thread that died midway cover only part of the region: reported as none.
  for (const std::string* reason : {&why_not_, &thread_error_})
    if (!reason->empty()) {
      s.why_not = *reason;
      return s;
    }
  return summarize(readings_, last_error_);
}

// One reading at once, even when stop() comes first, then one every period until stop().
// Nothing may escape the thread (std::terminate): an exception ends the sampling and stop()
// reports it.
void ClockSampler::sample_loop() {
  try {
    auto next = std::chrono::steady_clock::now();
    for (;;) {
      ClockReading r;
      std::string error;
      if (reader_(&r, &error))
        readings_.push_back(r);
      else
        last_error_ = error;
      // A reading slower than the period delays the next one instead of bunching the ones after.
      next = std::max(next + period_, std::chrono::steady_clock::now());
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_until(lock, next, [this] { return stop_requested_; })) break;
    }
  } catch (const std::exception& e) {
    thread_error_ = std::string("sampling thread: ") + e.what();
  } catch (...) {
    thread_error_ = "sampling thread: unknown exception";
  }
}

}  // namespace orthopt::bench
