// belay's main, without CLI11 in sight: apps/cli/main.cpp includes only this.
#pragma once

namespace belay {

// The whole CLI (apps/cli/cli_main.cpp): parses argv, runs the subcommand, returns the exit status.
int cli_main(int argc, char** argv);

}  // namespace belay
