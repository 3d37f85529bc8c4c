// Catch2's main for every unit test of the project.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
