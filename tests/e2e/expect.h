/* EXPECT_EQ for the plain-C end-to-end programs: compares two integer
 * expressions, prints both on a mismatch and counts it in `failures`, which
 * each program reports at the end ("OK" / "FAILED" and its exit status). */
#ifndef VMMSHIM_TESTS_E2E_EXPECT_H_
#define VMMSHIM_TESTS_E2E_EXPECT_H_

#include <stdio.h>

static int failures = 0;
#define EXPECT_EQ(a, b)                                                              \
  do {                                                                               \
    long long va_ = (long long)(a), vb_ = (long long)(b);                            \
    if (va_ != vb_) {                                                                \
      fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, \
              #a, va_, #b, vb_);                                                     \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

#endif  /* VMMSHIM_TESTS_E2E_EXPECT_H_ */
