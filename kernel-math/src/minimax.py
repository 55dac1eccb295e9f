"""The polynomial coefficients of approx.rs and trig.rs: discrete weighted minimax fits against mpmath.

Each fit minimizes max |w(x) (f(x) - p(x))| over a 3000-point Chebyshev grid of the reduced range (a
least-squares start, then three LP refinements on the scaled residual), and the coefficients are then
rounded to f32. The printed error is the fit's own, in units of 2^-24 relative to the function (≈ ulp);
the functions' final ulp bounds come from the Rust tests, which see f32 rounding too.

usage: python minimax.py        (needs numpy, scipy, mpmath: the benchmark venv has them)
"""
import mpmath as mp
import numpy as np
from scipy.optimize import linprog

mp.mp.dps = 40


def grid(lo, hi, n):
    k = np.arange(n)
    xs = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)
    return np.concatenate([xs, [lo, hi]])


def fit(f, w, lo, hi, deg, n=3000):
    """Coefficients c (lowest degree first) minimizing max |w(x) (f(x) - sum_j c_j x^j)|."""
    xs = grid(lo, hi, n)
    F = np.array([float(f(mp.mpf(x))) for x in xs])
    W = np.array([float(w(mp.mpf(x))) for x in xs])
    B = np.array([[x ** j for j in range(deg + 1)] for x in xs])
    WB = W[:, None] * B
    c = np.linalg.lstsq(WB, W * F, rcond=None)[0]
    m = deg + 1
    for _ in range(3):
        e = W * F - WB @ c
        s = np.max(np.abs(e))
        col = np.max(np.abs(WB), axis=0)
        A = WB / col
        ones = -np.ones((len(xs), 1))
        cost = np.zeros(m + 1)
        cost[-1] = 1
        r = linprog(cost, A_ub=np.vstack([np.hstack([-A, ones]), np.hstack([A, ones])]),
                    b_ub=np.concatenate([-(e / s), e / s]), bounds=[(None, None)] * (m + 1),
                    method="highs",
                    options=dict(primal_feasibility_tolerance=1e-10, dual_feasibility_tolerance=1e-10))
        assert r.success, r.message
        c = c + r.x[:m] * s / col
    err = np.max(np.abs(W * F - WB @ c))
    return [np.float32(v) for v in c], err / 2.0 ** -24


sq = mp.sqrt
FITS = {
    # e^r - 1 = r + r^2/2 + r^3 P(r), |r| <= ln2/2 (tanh)
    "EXPM1_P": (lambda r: (mp.expm1(r) - r - r * r / 2) / r ** 3 if abs(r) > 1e-20 else mp.mpf(1) / 6,
                lambda r: r * r / (mp.expm1(r) / r) if abs(r) > 1e-20 else mp.mpf(0),
                -float(mp.log(2) / 2) - 1e-4, float(mp.log(2) / 2) + 1e-4, 4),
    # ln(1 + f) = f - f^2/2 + f^3 P(f), 1 + f in [sqrt(1/2), sqrt(2))
    "LOG_P": (lambda x: (mp.log1p(x) - x + x * x / 2) / x ** 3 if abs(x) > 1e-30 else mp.mpf(1) / 3,
              lambda x: x * x / (mp.log1p(x) / x) if abs(x) > 1e-30 else mp.mpf(0),
              float(sq(0.5) - 1), float(sq(2) - 1), 7),
    # sin(r) = r + r z S(z), z = r^2 on [0, 0.79]
    "SIN_S": (lambda z: (mp.sin(sq(z)) - sq(z)) / (sq(z) * z) if z > 0 else -mp.mpf(1) / 6,
              lambda z: z / (mp.sin(sq(z)) / sq(z)) if z > 0 else mp.mpf(0), 0.0, 0.79 ** 2, 2),
    # cos(r) = 1 - z/2 + z^2 C(z) on [0, 0.79]
    "COS_C": (lambda z: (mp.cos(sq(z)) - 1 + z / 2) / (z * z) if z > 0 else mp.mpf(1) / 24,
              lambda z: z * z / mp.cos(sq(z)), 0.0, 0.79 ** 2, 2),
}

def lit(v):
    """The shortest literal that round-trips to the f32 `v`."""
    v = np.float32(v)
    if v == 0 or 1e-3 <= abs(v) < 1e3:
        return np.format_float_positional(v, unique=True)
    return np.format_float_scientific(v, unique=True)


def erf_table():
    """erf on [0, 4) in 8 intervals of 0.5: `t = |x| - c_i` (c_0 = 0, else the midpoint), then
    `erf = t + t q(t)` on interval 0 and `c0_i + t q_i(t)` on the others, q of degree 6."""
    rows = []
    for i in range(8):
        a, b = 0.5 * i, 0.5 * (i + 1)
        if i == 0:
            f = lambda t: (mp.erf(t) / t if t != 0 else 2 / sq(mp.pi)) - 1
            q, err = fit(f, lambda t: 1, a, b, 6)
            rows.append((0.0, 1.0, 0.0, q, err))
        else:
            c = (a + b) / 2
            p, err = fit(lambda t: mp.erf(t + c), lambda t: 1 / mp.erf(t + c), a - c, b - c, 7)
            rows.append((c, 0.0, p[0], p[1:], err))
    print(f"erf table (fit error {max(r[4] for r in rows):.4f} ulp)")
    print("ERF_CENTER:", [lit(r[0]) for r in rows])
    print("ERF_SLOPE:", [lit(r[1]) for r in rows])
    print("ERF_BASE:", [lit(r[2]) for r in rows])
    for k in reversed(range(7)):
        print(f"ERF_Q[{6 - k}] (t^{k}):", [lit(r[3][k]) for r in rows])


if __name__ == "__main__":
    for name, (f, w, lo, hi, deg) in FITS.items():
        c, err = fit(f, w, lo, hi, deg)
        lits = ", ".join(lit(v) for v in reversed(c))
        print(f"{name} (highest degree first; fit error {err:.4f} ulp): [{lits}]")
    erf_table()
