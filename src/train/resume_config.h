// resume_config.h: what a resumed run may change in its config, and the run directory's record of the configs it
// ran with. config.yaml is the config the run started with and is never rewritten by a resume; a resume that
// changes keys writes config.resume-<step>.yaml next to it, so the history of every change stays in the directory.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "config/config.h"

namespace hgrn {

// Keys that only say how long to train, how often to evaluate, log or checkpoint, where files go, or how the same
// computation is laid out in memory and threads: changing them on resume continues the same training.
bool may_change_on_resume(const std::string& key);

// Compares the config stored in the checkpoint at `path` with the run's `config`, prints every changed key to `log`
// and throws ConfigError listing the keys that may not change unless `allow_changes`. Returns the changes.
std::vector<ConfigChange> check_resume_config(const std::string& stored_yaml, const std::string& path,
                                              const Config& config, bool allow_changes, std::ostream& log);

// Writes <run_dir>/config.yaml for a fresh run (resumed_step < 0) or where it is missing, and for a resume at
// `resumed_step` that changed keys also <run_dir>/config.resume-<step>.yaml, each atomically.
void record_run_config(const Config& config, int64_t resumed_step, const std::vector<ConfigChange>& changes);

}  // namespace hgrn
