// The host's side of a protocol-3 step (oplist_schedule.h): the learning-rate schedules, the optimizers'
// per-step host scalars and the counters, read from the program's arrays. Plain C++: no libtorch header.

#include "oplist_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradbridge::exported {

std::string hex_text(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%a", value);
  return buffer;
}

namespace {

std::vector<double> doubles(ProgramArrays& in, const char* what) {
  std::vector<double> out(in.count(what));
  for (double& value : out) value = in.number(what);
  return out;
}

std::vector<int64_t> integers(ProgramArrays& in, const char* what) {
  std::vector<int64_t> out(in.count(what));
  for (int64_t& value : out) value = in.integer(what);
  return out;
}

}  // namespace

std::vector<double> Schedule::closed_form() const {
  const double pi = 3.141592653589793;  // math.pi
  std::vector<double> out;
  for (double b : base_lrs) {
    if (name == "step") {
      out.push_back(b * std::pow(gamma, static_cast<double>(last_epoch / step_size)));
    } else if (name == "multistep") {
      int64_t passed = 0;
      for (int64_t m : milestones) passed += m <= last_epoch ? 1 : 0;
      out.push_back(b * std::pow(gamma, static_cast<double>(passed)));
    } else if (name == "exponential") {
      out.push_back(b * std::pow(gamma, static_cast<double>(last_epoch)));
    } else if (name == "cosine") {
      out.push_back(eta_min + (b - eta_min) * (1 + std::cos(pi * static_cast<double>(last_epoch) / static_cast<double>(t_max))) / 2);
    } else if (name == "linear") {
      out.push_back(b * (start_factor + (end_factor - start_factor) *
                                            static_cast<double>(std::min(total_iters, last_epoch)) /
                                            static_cast<double>(total_iters)));
    } else {
      throw std::invalid_argument("schedule " + name + " cannot restart");
    }
  }
  return out;
}

double Schedule::anneal(double start, double end, double pct) const {
  const double pi = 3.141592653589793;  // math.pi
  if (cos) {
    double cos_out = std::cos(pi * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

double Schedule::one_cycle_value(int64_t key, size_t group) const {
  switch (key) {
    case 0: return initial.at(group);
    case 1: return max_lrs.at(group);
    case 2: return min_lrs.at(group);
    case 3: return max_momenta.at(group);
    default: return base_momenta.at(group);
  }
}

std::vector<double> Schedule::one_cycle(std::vector<double> lrs) {
  const int64_t step_num = last_epoch;
  if (step_num > total_steps)
    throw std::invalid_argument("Tried to step " + std::to_string(step_num) + " times. The specified number of total steps is " + std::to_string(total_steps));
  std::vector<double> cycled(lrs.size(), 0.0);
  for (size_t g = 0; g < lrs.size(); g++) {
    double start_step = 0.0;
    for (size_t i = 0; i < end_steps.size(); i++) {
      const double end_step = end_steps[i];
      if (static_cast<double>(step_num) <= end_step || i == end_steps.size() - 1) {
        const double pct = (static_cast<double>(step_num) - start_step) / (end_step - start_step);
        lrs[g] = anneal(one_cycle_value(start_keys[i], g), one_cycle_value(end_keys[i], g), pct);
        if (cycle_momentum)
          cycled[g] = anneal(one_cycle_value(start_momentum_keys[i], g), one_cycle_value(end_momentum_keys[i], g), pct);
        break;
      }
      start_step = end_steps[i];
    }
  }
  if (cycle_momentum) momenta = cycled;
  return lrs;
}

std::vector<double> Schedule::step(std::vector<double> lrs) {
  if (name.empty()) return lrs;
  if (name == "plateau") throw std::invalid_argument("ReduceLROnPlateau steps with a metric (schedule_epoch)");
  last_epoch++;
  const int64_t e = last_epoch;
  if (name == "onecycle") return one_cycle(std::move(lrs));
  if (name == "sequential") {
    size_t index = 0;
    for (int64_t m : milestones) index += m <= e ? 1 : 0;
    Schedule& child = children.at(index);
    if (index > 0 && milestones[index - 1] == e) {
      child.last_epoch = 0;
      return child.closed_form();
    }
    return child.step(std::move(lrs));
  }
  if (name == "step") {
    if (e == 0 || e % step_size != 0) return lrs;
    for (auto& lr : lrs) lr = lr * gamma;
  } else if (name == "multistep") {
    int64_t count = 0;
    for (int64_t m : milestones) count += m == e ? 1 : 0;
    if (count == 0) return lrs;
    for (auto& lr : lrs) lr = lr * std::pow(gamma, static_cast<double>(count));
  } else if (name == "exponential") {
    if (e == 0) return lrs;
    for (auto& lr : lrs) lr = lr * gamma;
  } else if (name == "cosine") {
    if (e == 0) return lrs;
    const double pi = 3.141592653589793;  // math.pi
    if ((e - 1 - t_max) % (2 * t_max) == 0) {
      for (size_t i = 0; i < lrs.size(); i++)
        lrs[i] = lrs[i] + (base_lrs[i] - eta_min) * (1 - std::cos(pi / static_cast<double>(t_max))) / 2;
      return lrs;
    }
    for (auto& lr : lrs)
      lr = (1 + std::cos(pi * static_cast<double>(e) / static_cast<double>(t_max))) /
               (1 + std::cos(pi * static_cast<double>(e - 1) / static_cast<double>(t_max))) * (lr - eta_min) +
           eta_min;
  } else if (name == "linear") {
    if (e == 0) {
      for (auto& lr : lrs) lr = lr * start_factor;
      return lrs;
    }
    if (e > total_iters) return lrs;
    for (auto& lr : lrs)
      lr = lr * (1.0 + (end_factor - start_factor) /
                           (static_cast<double>(total_iters) * start_factor +
                            static_cast<double>(e - 1) * (end_factor - start_factor)));
  } else {
    throw std::invalid_argument("unknown schedule " + name);
  }
  return lrs;
}

bool Schedule::better(double a) const {
  if (minimize && relative) return a < best * (1.0 - threshold);
  if (minimize) return a < best - threshold;
  if (relative) return a > best * (threshold + 1.0);
  return a > best + threshold;
}

std::vector<double> Schedule::step_metric(std::vector<double> lrs, double metric) {
  if (name != "plateau") return step(std::move(lrs));
  last_epoch++;
  if (better(metric)) {
    best = metric;
    num_bad_epochs = 0;
  } else {
    num_bad_epochs++;
  }
  if (cooldown_counter > 0) {
    cooldown_counter--;
    num_bad_epochs = 0;
  }
  if (num_bad_epochs > patience) {
    for (size_t i = 0; i < lrs.size(); i++) {
      double reduced = std::max(lrs[i] * factor, min_lrs[i]);
      if (lrs[i] - reduced > eps) lrs[i] = reduced;
    }
    cooldown_counter = cooldown;
    num_bad_epochs = 0;
  }
  return lrs;
}

void Schedule::read(ProgramArrays& in) {
  name = in.text("scheduler name");
  base_lrs = doubles(in, "scheduler base_lrs");
  if (name == "step") {
    step_size = in.integer("scheduler step_size");
    gamma = in.number("scheduler gamma");
  } else if (name == "multistep") {
    milestones = integers(in, "scheduler milestones");
    gamma = in.number("scheduler gamma");
  } else if (name == "exponential") {
    gamma = in.number("scheduler gamma");
  } else if (name == "cosine") {
    t_max = in.integer("scheduler T_max");
    eta_min = in.number("scheduler eta_min");
  } else if (name == "linear") {
    start_factor = in.number("scheduler start_factor");
    end_factor = in.number("scheduler end_factor");
    total_iters = in.integer("scheduler total_iters");
  } else if (name == "sequential") {
    milestones = integers(in, "scheduler milestones");
    const size_t count = in.count("scheduler schedulers");
    for (size_t k = 0; k < count; k++) {
      children.emplace_back();
      children.back().read(in);
    }
    if (children.size() != milestones.size() + 1) throw std::invalid_argument("program: SequentialLR needs one milestone fewer than schedules");
  } else if (name == "plateau") {
    minimize = in.flag("scheduler minimize");
    relative = in.flag("scheduler relative");
    factor = in.number("scheduler factor");
    patience = in.integer("scheduler patience");
    threshold = in.number("scheduler threshold");
    cooldown = in.integer("scheduler cooldown");
    min_lrs = doubles(in, "scheduler min_lrs");
    eps = in.number("scheduler eps");
  } else if (name == "onecycle") {
    total_steps = in.integer("scheduler total_steps");
    initial = doubles(in, "scheduler initial");
    max_lrs = doubles(in, "scheduler max_lrs");
    min_lrs = doubles(in, "scheduler min_lrs");
    end_steps = doubles(in, "scheduler end_steps");
    max_momenta = doubles(in, "scheduler max_momenta");
    base_momenta = doubles(in, "scheduler base_momenta");
    start_keys = integers(in, "scheduler start_keys");
    end_keys = integers(in, "scheduler end_keys");
    start_momentum_keys = integers(in, "scheduler start_momentum_keys");
    end_momentum_keys = integers(in, "scheduler end_momentum_keys");
    cos = in.flag("scheduler cos");
    cycle_momentum = in.flag("scheduler cycle_momentum");
    const size_t phases = end_steps.size(), groups = base_lrs.size();
    if (phases == 0 || start_keys.size() != phases || end_keys.size() != phases || start_momentum_keys.size() != phases ||
        end_momentum_keys.size() != phases || initial.size() != groups || max_lrs.size() != groups || min_lrs.size() != groups ||
        (cycle_momentum && (max_momenta.size() != groups || base_momenta.size() != groups)))
      throw std::invalid_argument("program: scheduler onecycle's phases or groups do not add up");
  } else {
    throw std::invalid_argument("program: unknown scheduler '" + name + "'");
  }
  // Java's ProgramCheck refused these and every count past 2^40 already; the divisions above stay guarded here
  // (an integer division by zero, or INT64_MIN % -1, is SIGFPE: the JVM's end)
  if (step_size < 1 || t_max < 1 || total_iters < 1 || step_size > (int64_t{1} << 40) || t_max > (int64_t{1} << 40))
    throw std::invalid_argument("program scheduler " + name + ": step_size, T_max and total_iters must be 1 to 2^40");
}

// ---- the optimizer: training and counters ----

void Training::read(ProgramArrays& in) {
  optimizer = in.text("training optimizer");
  if (optimizer != "sgd" && optimizer != "adam" && optimizer != "adamw" && optimizer != "rmsprop" && optimizer != "adagrad")
    throw std::invalid_argument("program: unknown optimizer '" + optimizer + "'");
  const size_t count = in.count("training groups");
  for (size_t g = 0; g < count; g++) {
    Group group;
    const size_t params = in.count("group params");
    for (size_t k = 0; k < params; k++) {
      group.params.push_back(in.text("group params"));
      trainable.push_back(group.params.back());
    }
    group.beta1 = in.number("group beta1");
    group.beta2 = in.number("group beta2");
    group.momentum = in.number("group momentum");
    group.weight_decay = in.number("group weight_decay");
    group.lr_decay = in.number("group lr_decay");
    groups.push_back(group);
  }
  accumulate = in.integer("training accumulate");
  if (accumulate < 1 || accumulate > 65536) throw std::invalid_argument("program: accumulate " + std::to_string(accumulate) + ", expected 1 to 65536");
  schedule.interval = in.text("training scheduler_interval");
  if (in.flag("training scheduler")) schedule.read(in);
  read_counters(in);
}

void Training::read_counters(ProgramArrays& in) {
  steps = in.integer("counters steps");
  lrs = doubles(in, "counters lrs");
  if (lrs.size() != groups.size())
    throw std::invalid_argument("program counters: " + std::to_string(lrs.size()) + " learning rates for " + std::to_string(groups.size()) + " parameter groups");
  if (!schedule.name.empty() && schedule.base_lrs.size() != groups.size())
    throw std::invalid_argument("program scheduler: base_lrs for " + std::to_string(schedule.base_lrs.size()) + " groups, not " + std::to_string(groups.size()));
  schedule.last_epoch = in.integer("counters last_epoch");
  schedule.best = in.number("counters best");
  schedule.num_bad_epochs = in.integer("counters num_bad_epochs");
  schedule.cooldown_counter = in.integer("counters cooldown_counter");
  const std::vector<int64_t> children = integers(in, "counters children_last_epochs");
  if (children.size() != schedule.children.size())
    throw std::invalid_argument("program counters: " + std::to_string(children.size()) + " children's epochs for " + std::to_string(schedule.children.size()) + " schedules");
  for (size_t k = 0; k < children.size(); k++) schedule.children[k].last_epoch = children[k];
  // files written before OneCycleLR's momentum was held lack the entry: Java hands none, nothing cycled
  schedule.momenta = doubles(in, "counters momenta");
  if (!schedule.momenta.empty() && (!schedule.cycle_momentum || schedule.momenta.size() != groups.size()))
    throw std::invalid_argument("program counters: " + std::to_string(schedule.momenta.size()) + " momenta for " + std::to_string(groups.size()) + " parameter groups of a schedule that cycles " + (schedule.cycle_momentum ? "them" : "none"));
}

std::vector<std::pair<std::string, double>> Training::host_scalars() const {
  std::vector<std::pair<std::string, double>> v;
  const double step = static_cast<double>(steps);
  for (size_t g = 0; g < groups.size(); g++) {
    const Group& group = groups[g];
    const double lr = lrs[g];
    auto put = [&](const char* name, double value) { v.emplace_back("scalar:" + std::string(name) + ":" + std::to_string(g), value); };
    const bool cycled = !schedule.momenta.empty();
    if (optimizer == "sgd" || optimizer == "rmsprop") {
      put("neg_lr", -lr);
      put("momentum", cycled ? schedule.momenta[g] : group.momentum);
    } else if (optimizer == "adagrad") {
      put("neg_clr", -(lr / (1 + (step - 1) * group.lr_decay)));
    } else {
      const double beta1 = cycled ? schedule.momenta[g] : group.beta1;
      put("one_minus_beta1", 1 - beta1);
      double bias_correction1 = 1 - std::pow(beta1, step);
      double bias_correction2 = 1 - std::pow(group.beta2, step);
      double step_size = lr / bias_correction1;
      put("neg_step_size", -step_size);
      put("bias_correction2_sqrt", std::pow(bias_correction2, 0.5));
      put("decay", 1 - lr * group.weight_decay);
    }
  }
  return v;
}

std::string Training::counters() const {
  std::string text = "{\"steps\":" + std::to_string(steps) + ",\"lrs\":[";
  for (size_t g = 0; g < lrs.size(); g++) text += (g ? ",\"" : "\"") + hex_text(lrs[g]) + "\"";
  text += "],\"last_epoch\":" + std::to_string(schedule.last_epoch) + ",\"best\":\"" + hex_text(schedule.best) +
          "\",\"num_bad_epochs\":" + std::to_string(schedule.num_bad_epochs) +
          ",\"cooldown_counter\":" + std::to_string(schedule.cooldown_counter) + ",\"children_last_epochs\":[";
  for (size_t k = 0; k < schedule.children.size(); k++) text += (k ? "," : "") + std::to_string(schedule.children[k].last_epoch);
  text += "],\"momenta\":[";
  for (size_t g = 0; g < schedule.momenta.size(); g++) text += (g ? ",\"" : "\"") + hex_text(schedule.momenta[g]) + "\"";
  return text + "]}";
}

void Training::set_lr(int64_t group, double lr) {
  if (group < 0) {
    for (auto& value : lrs) value = lr;
    return;
  }
  if (group >= static_cast<int64_t>(lrs.size()))
    throw std::invalid_argument("set_group_lr: no parameter group " + std::to_string(group) + "; there are " + std::to_string(lrs.size()));
  lrs[group] = lr;
}

void Training::step_schedule() {
  if (schedule.interval == "step") lrs = schedule.step(lrs);
}

void Training::schedule_epoch(double metric) {
  if (schedule.interval == "epoch") lrs = schedule.step_metric(lrs, metric);
}

}  // namespace gradbridge::exported
