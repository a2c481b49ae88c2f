// attention-bench: the CPU causal attention kernel (kernels/attention.h,
// kernels/cpu/attention.cpp), forward and backward ms at B*H = 48 heads for
// T in {64, 256, 1024} and D in {32, 64}, on `--threads` threads (default 2).
// Median of 7 runs after 2 warm-up calls (3 at T = 1024). `--cpu-time`: the
// process's CPU time (all threads together) instead of wall time, for a
// machine that other jobs share (with --threads 1 it is the kernel's own time).
// PyTorch's side: torch.nn.functional.scaled_dot_product_attention(is_causal=True)
// on the same shapes with torch.set_num_threads(2).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
using namespace fanout;
using clk = std::chrono::steady_clock;

bool cpu_time = false;
double now_ms() {
  if (!cpu_time) return std::chrono::duration<double, std::milli>(clk::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

template <class F>
double median_ms(F f, int runs) {
  f();
  f();
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const double t0 = now_ms();
    f();
    t.push_back(now_ms() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor rnd(const Shape& s, std::mt19937& g) {
  Tensor t = Tensor::empty(s);
  std::normal_distribution<float> u(0, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = u(g);
  return t;
}

int main(int argc, char** argv) {
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
      if (threads < 1) {
        std::fprintf(stderr, "attention-bench: --threads must be a positive integer, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--cpu-time")) {
      cpu_time = true;
    } else {
      const bool help = !std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h");
      if (!help) std::fprintf(stderr, "attention-bench: unknown argument '%s'\n", argv[i]);
      std::fprintf(help ? stdout : stderr, "usage: attention-bench [--threads N] [--cpu-time]\n");
      return help ? 0 : 2;
    }
  }
  std::mt19937 g(1);
  Context ctx(Device::cpu());
  ctx.math.cpu_threads = threads;
  const int64_t B = 4, H = 12;
  std::printf("threads %d, B*H %lld, %s time\n     T    D   forward ms  backward ms\n", threads, static_cast<long long>(B * H),
              cpu_time ? "CPU" : "wall");
  for (int64_t T : {64, 256, 1024})
    for (int64_t D : {32, 64}) {
      const Shape s{B, H, T, D};
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      Tensor q = rnd(s, g), k = rnd(s, g), v = rnd(s, g), dy = rnd(s, g);
      Tensor y = Tensor::empty(s), lse = Tensor::empty(Shape{B, H, T});
      Tensor dq = Tensor::empty(s), dk = Tensor::empty(s), dv = Tensor::empty(s);
      const int runs = T >= 1024 ? 3 : 7;
      const double f = median_ms([&] { kernels::attention_forward(ctx, q, k, v, scale, y, lse); }, runs);
      const double b = median_ms(
          [&] { kernels::attention_backward(ctx, q, k, v, scale, y, lse, dy, dq, dk, dv); }, runs);
      std::printf("%6lld %4lld %12.3f %12.3f\n", static_cast<long long>(T), static_cast<long long>(D), f, b);
      std::fflush(stdout);
    }
}
