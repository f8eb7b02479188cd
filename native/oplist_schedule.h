// The host's side of a protocol-3 step (python/gradbridge/_runtime/program.py's twins): the optimizer's groups and
// per-step scalars, the learning-rate schedule and the counters a checkpoint saves. Plain C++ (no libtorch):
// oplist_schedule.cpp holds the arithmetic, read from the program's arrays (oplist_arrays.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "oplist_arrays.h"

namespace gradbridge::exported {

// A double as C's "%a" writes it (Python's float.fromhex and strtod read it back exactly, inf included).
std::string hex_text(double value);

struct Group {
  std::vector<std::string> params;
  double momentum = 0, beta1 = 0, beta2 = 0, weight_decay = 0, lr_decay = 0;
};

// export/scheduler_modules.py's arithmetic (torch.optim.lr_scheduler's chainable get_lr) for the schedules
// protocol 3 holds; `step` is one scheduler.step(), `step_metric` ReduceLROnPlateau.step(metric); SequentialLR
// restarts a child at its milestone with the child's closed form.
struct Schedule {
  std::string name;              // empty: no schedule
  std::string interval = "none";  // "step", "epoch" or "none"
  std::vector<double> base_lrs;
  int64_t step_size = 1, t_max = 1, total_iters = 1, patience = 0, cooldown = 0;
  double gamma = 1, eta_min = 0, start_factor = 1, end_factor = 1, factor = 1, threshold = 0, eps = 0;
  bool minimize = true, relative = true;
  std::vector<int64_t> milestones;  // MultiStepLR's, or SequentialLR's
  std::vector<double> min_lrs;
  std::vector<Schedule> children;  // SequentialLR's
  // OneCycleLR's, resolved at export (scheduler_modules.OneCycleLR): per group the initial, max and min lrs
  // and momenta; per phase its end step and the keys of the values it anneals between (0 initial lr, 1 max
  // lr, 2 min lr, 3 max momentum, 4 base momentum)
  int64_t total_steps = 0;
  std::vector<double> initial, max_lrs, end_steps, max_momenta, base_momenta;
  std::vector<int64_t> start_keys, end_keys, start_momentum_keys, end_momentum_keys;
  bool cos = true, cycle_momentum = false;
  // what a checkpoint saves (and each child's last_epoch); momenta: OneCycleLR's cycled momentum (SGD) or
  // beta1 (Adam) per group, empty when not cycled
  int64_t last_epoch = 0, num_bad_epochs = 0, cooldown_counter = 0;
  double best = 0;
  std::vector<double> momenta;

  // the closed form from the base lrs, what SequentialLR's step(0) uses to restart a schedule
  std::vector<double> closed_form() const;
  double anneal(double start, double end, double pct) const;
  double one_cycle_value(int64_t key, size_t group) const;
  std::vector<double> one_cycle(std::vector<double> lrs);
  std::vector<double> step(std::vector<double> lrs);
  bool better(double a) const;
  std::vector<double> step_metric(std::vector<double> lrs, double metric);
  // the spec (ProgramArrays.java's `schedule`), its divisors refused out of range
  void read(ProgramArrays& in);
};

// The program's `training` (fixed at export) and `counters` (what a checkpoint saves beside the state tensors).
struct Training {
  std::string optimizer;
  std::vector<Group> groups;
  std::vector<std::string> trainable;  // the groups' parameters, in group order
  std::vector<double> lrs;             // per group
  Schedule schedule;
  int64_t steps = 0;
  int64_t accumulate = 1;

  // ProgramArrays.java's `training` then `counters`, each checked as the native layer always did
  void read(ProgramArrays& in);
  // torch.optim's per-step Python doubles, per group, by binding (program.host_scalars is the specification)
  std::vector<std::pair<std::string, double>> host_scalars() const;
  // the counters as JSON (program.counters): written, never read back here (Java's Gson reads them)
  std::string counters() const;
  void set_lr(int64_t group, double lr);
  void step_schedule();                // after an optimizer step: a per-step schedule steps
  void schedule_epoch(double metric);  // at an epoch's end: a per-epoch schedule steps

 private:
  void read_counters(ProgramArrays& in);
};

}  // namespace gradbridge::exported
