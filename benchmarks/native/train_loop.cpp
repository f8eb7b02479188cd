// The native limit for gradbridge's benchmark: the same exported training module, the same
// loop, driven from C++ against the pip wheel's libtorch (no JVM, no Python).
//
// Usage: train_loop MODEL.pt DATA.bin MODE THREADS [BATCH]
//   DATA.bin: int64 n, int64 rank_x, dims_x..., int64 rank_y, dims_y..., int64 y_is_int,
//             then x as float32 and y as float32 or int64 (little endian), as bench.py writes it.
//   MODE: step  -> a call is train_step(x, y) (one batch = all of x)
//         fused -> a call is train_epoch(x, y, perm, BATCH), perm = 0..n-1
// A benchmark worker: prints one JSON line with its settings, then answers each line "run N" on
// stdin with {"seconds": S}, the wall time of N calls, until "quit" or end of input.
#include <ATen/Parallel.h>
#include <torch/script.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <malloc.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

static std::vector<int64_t> read_dims(std::ifstream& in) {
  int64_t rank = 0;
  in.read(reinterpret_cast<char*>(&rank), sizeof rank);
  std::vector<int64_t> dims(rank);
  in.read(reinterpret_cast<char*>(dims.data()), rank * sizeof(int64_t));
  return dims;
}

static torch::Tensor read_tensor(std::ifstream& in, const std::vector<int64_t>& dims, torch::Dtype dtype) {
  torch::Tensor t = torch::empty(dims, torch::TensorOptions().dtype(dtype));
  in.read(reinterpret_cast<char*>(t.data_ptr()), t.numel() * t.element_size());
  return t;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: train_loop MODEL.pt DATA.bin step|fused THREADS [BATCH]\n";
    return 2;
  }
  const std::string mode = argv[3];
  // The allocator settings gradbridge's Java library applies (dev.gradbridge.NativeMemory): freed
  // tensor memory stays in the process instead of being trimmed and faulted in again every step.
  if (!std::getenv("GRADBRIDGE_NATIVE_MALLOC_DEFAULTS")) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    mallopt(M_TOP_PAD, 64 << 20);
  }
  at::set_num_threads(std::stoi(argv[4]));
  // Same settings as gradbridge's Java and Python drivers: autograd on, no optimizing executor.
  torch::jit::setGraphExecutorOptimize(false);
  torch::autograd::GradMode::set_enabled(true);

  std::ifstream in(argv[2], std::ios::binary);
  int64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), sizeof n);
  auto x_dims = read_dims(in);
  auto y_dims = read_dims(in);
  int64_t y_is_int = 0;
  in.read(reinterpret_cast<char*>(&y_is_int), sizeof y_is_int);
  torch::Tensor x = read_tensor(in, x_dims, torch::kFloat32);
  torch::Tensor y = read_tensor(in, y_dims, y_is_int ? torch::kInt64 : torch::kFloat32);

  torch::jit::Module module = torch::jit::load(argv[1]);
  module.train(true);
  torch::jit::Method train_step = module.get_method("train_step");
  torch::jit::Method train_epoch = module.get_method("train_epoch");
  const int64_t batch = argc > 5 ? std::stoll(argv[5]) : n;
  torch::Tensor perm = torch::arange(n, torch::kInt64);

  // Each call reads its losses as gradbridge's Java call does (float32 widened to double in a
  // buffer the caller keeps): a training loop that never looks at its loss is not one.
  std::vector<double> losses;
  auto call = [&]() {
    at::Tensor out = mode == "fused" ? train_epoch({x, y, perm, batch}).toTensor() : train_step({x, y}).toTensor();
    const float* data = out.const_data_ptr<float>();
    losses.assign(data, data + out.numel());
  };
  std::cout << "{\"ready\": true, \"intra_op_threads\": " << at::get_num_threads()
            << ", \"interop_threads\": " << at::get_num_interop_threads() << ", \"native_memory\": \""
            << (std::getenv("GRADBRIDGE_NATIVE_MALLOC_DEFAULTS") ? "glibc defaults"
                                                                 : "glibc mallopt M_MMAP_THRESHOLD=33554432 "
                                                                   "M_TRIM_THRESHOLD=268435456 M_TOP_PAD=67108864")
            << "\"}" << std::endl;
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
    const long calls = std::stol(line.substr(4));  // "run N"
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) call();
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    std::cout.precision(9);
    std::cout << "{\"seconds\": " << std::fixed << elapsed.count() << "}" << std::endl;
  }
  return 0;
}
