// A custom operator with its own autograd, for gradbridge's custom-operator example.
//
//   gbops::scaled_tanh(x, alpha)      = alpha * tanh(x), backward: grad * alpha * (1 - tanh(x)^2)
//   gbops::scaled_tanh_bad_grad(x, a) = the same forward with a deliberately wrong backward
//                                       (missing the alpha factor): `gradbridge gradcheck` must
//                                       catch it, naming the parameter.
//
// Registered with TORCH_LIBRARY, so TorchScript (Python and Java alike) calls it as
// torch.ops.gbops.scaled_tanh once the shared library is loaded. CPU kernels, float32 and
// float64. Build: gradbridge build-op examples/custom-op/scaled_tanh.cpp -o build/ops/libgbops.so
#include <torch/library.h>
#include <torch/autograd.h>
#include <ATen/ATen.h>

namespace {

at::Tensor scaled_tanh_forward_kernel(const at::Tensor& x, double alpha) {
  return x.tanh().mul(alpha);
}

at::Tensor scaled_tanh_backward_kernel(const at::Tensor& grad, const at::Tensor& x, double alpha, bool wrong) {
  at::Tensor t = x.tanh();
  at::Tensor local = (1 - t * t);
  return wrong ? grad * local : grad * local * alpha;
}

template <bool Wrong>
class ScaledTanh : public torch::autograd::Function<ScaledTanh<Wrong>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double alpha) {
    ctx->save_for_backward({x});
    ctx->saved_data["alpha"] = alpha;
    at::AutoDispatchBelowADInplaceOrView guard;
    return scaled_tanh_forward_kernel(x, alpha);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    double alpha = ctx->saved_data["alpha"].toDouble();
    return {scaled_tanh_backward_kernel(grads[0], saved[0], alpha, Wrong), at::Tensor()};
  }
};

at::Tensor scaled_tanh_autograd(const at::Tensor& x, double alpha) {
  return ScaledTanh<false>::apply(x, alpha);
}

at::Tensor scaled_tanh_bad_grad_autograd(const at::Tensor& x, double alpha) {
  return ScaledTanh<true>::apply(x, alpha);
}

}  // namespace

TORCH_LIBRARY(gbops, m) {
  m.def("scaled_tanh(Tensor x, float alpha) -> Tensor");
  m.def("scaled_tanh_bad_grad(Tensor x, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(gbops, CPU, m) {
  m.impl("scaled_tanh", scaled_tanh_forward_kernel);
  m.impl("scaled_tanh_bad_grad", scaled_tanh_forward_kernel);
}

TORCH_LIBRARY_IMPL(gbops, Autograd, m) {
  m.impl("scaled_tanh", scaled_tanh_autograd);
  m.impl("scaled_tanh_bad_grad", scaled_tanh_bad_grad_autograd);
}
