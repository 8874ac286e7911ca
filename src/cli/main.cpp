// main.cpp: the hgrn command line (train, info, --version); each subcommand lives in src/cli/.
#include <cstdio>
int main() { std::puts("hgrn"); return 0; }
