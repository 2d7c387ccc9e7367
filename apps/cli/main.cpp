// The belay executable. The CLI itself is belay::cli_main (apps/cli/cli_main.cpp), in the
// belay_cli library beside the files it shares CLI11 with; this file does not include CLI11.
#include "apps/cli/cli_main.h"

int main(int argc, char** argv) { return belay::cli_main(argc, argv); }
