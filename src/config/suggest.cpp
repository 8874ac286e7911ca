// suggest.cpp: edit distance (optimal string alignment) and the closest-name lookup behind "did you mean" hints.
#include "config/suggest.h"

#include <algorithm>
#include <cctype>

namespace hgrn {

namespace {
std::string lowercase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  // Full table rather than two rows: the transposition case looks two rows back, and names are short.
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string lowered = lowercase(word);
  const int allowed = std::max<int>(1, static_cast<int>(word.size()) / 3);
  std::string best;
  int best_distance = allowed + 1;
  for (const std::string& candidate : candidates) {
    const int distance = edit_distance(lowered, lowercase(candidate));
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

}  // namespace hgrn
