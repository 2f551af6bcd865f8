/*
 * checksum_avx2.c -- the checksum functions built with AVX2 (see
 * checksum_impl.h); the Makefile compiles this file alone with -mavx2, and
 * checksum.c calls into it only on CPUs that report AVX2.
 */
#ifdef __x86_64__
#define CSUM_SUFFIX avx2
#include "checksum_impl.h"
#endif
