// resume_config.cpp: the keys a resume may change, the comparison with the checkpoint's config, and the config
// files of the run directory (resume_config.h).
#include "train/resume_config.h"

#include <filesystem>

#include "io/atomic_write.h"

namespace hgrn {

bool may_change_on_resume(const std::string& key) {
  static const std::vector<std::string> free_keys = {
      "training.max_steps", "training.eval_interval", "training.eval_batches", "training.threads",
      "training.collective_timeout_s", "training.overlap_reductions", "training.device", "training.deterministic",
      "training.max_nonfinite_steps", "data.valid_data"};
  for (const std::string& k : free_keys)
    if (k == key) return true;
  // Every recompute knob computes the same bits; checkpoint and logging keys say where and how often to write.
  for (const char* prefix : {"model.memory.", "checkpoint.", "logging."})
    if (key.rfind(prefix, 0) == 0) return true;
  return false;
}

std::vector<ConfigChange> check_resume_config(const std::string& stored_yaml, const std::string& path,
                                              const Config& config, bool allow_changes, std::ostream& log) {
  const std::vector<ConfigChange> changes = config_changes(stored_yaml, path + " (its stored config)", config);
  std::string refused;
  for (const ConfigChange& c : changes) {
    const bool free = may_change_on_resume(c.key);
    log << "config change on resume: " << c.key << ": " << c.before << " -> " << c.after
        << (free ? "" : allow_changes ? " (allowed by --allow-config-change)" : " (not allowed)") << "\n";
    if (!free) refused += (refused.empty() ? "" : ", ") + c.key + " " + c.before + " -> " + c.after;
  }
  if (!refused.empty() && !allow_changes)
    throw ConfigError(config.source + ": resuming from " + path + " with a config that changes what is trained: " +
                      refused + ". Restore these keys to the checkpoint's values, pass --allow-config-change to "
                      "continue with them anyway, or start a new run (another logging.run_dir, or "
                      "checkpoint.resume: never in an empty one)");
  return changes;
}

void record_run_config(const Config& config, int64_t resumed_step, const std::vector<ConfigChange>& changes) {
  const std::string dir = config.logging.run_dir;
  std::filesystem::create_directories(dir);
  const std::string original = dir + "/config.yaml";
  if (resumed_step < 0 || !std::filesystem::exists(original)) write_file_atomically(original, config_to_yaml(config));
  if (resumed_step >= 0 && !changes.empty()) {
    std::string text = "# resumed at step " + std::to_string(resumed_step) + " with these changes:\n";
    for (const ConfigChange& c : changes) text += "#   " + c.key + ": " + c.before + " -> " + c.after + "\n";
    write_file_atomically(dir + "/config.resume-" + std::to_string(resumed_step) + ".yaml",
                          text + config_to_yaml(config));
  }
}

}  // namespace hgrn
