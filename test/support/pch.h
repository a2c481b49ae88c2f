// Precompiled for every test suite: GoogleTest and the standard headers most
// tests include cost about two thirds of a test file's compile time. Only
// headers that rarely change belong here (a change rebuilds every test).
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
