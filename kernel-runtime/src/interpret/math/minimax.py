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
    # tanh(x) = x + x z P(z), z = x^2 on [0, 0.625]
    "TANH_P": (lambda z: (mp.tanh(sq(z)) - sq(z)) / (sq(z) * z) if z > 0 else -mp.mpf(1) / 3,
               lambda z: z / (mp.tanh(sq(z)) / sq(z)) if z > 0 else mp.mpf(0), 0.0, 0.625 ** 2, 4),
    # ln(1 + f) = f - f^2/2 + f^3 P(f), 1 + f in [sqrt(1/2), sqrt(2))
    "LOG_P": (lambda x: (mp.log1p(x) - x + x * x / 2) / x ** 3 if abs(x) > 1e-30 else mp.mpf(1) / 3,
              lambda x: x * x / (mp.log1p(x) / x) if abs(x) > 1e-30 else mp.mpf(0),
              float(sq(0.5) - 1), float(sq(2) - 1), 7),
    # erf(x) = x + x Q(z), z = x^2 on [0, 1]
    "ERF_Q": (lambda z: (mp.erf(sq(z)) / sq(z) if z > 0 else 2 / sq(mp.pi)) - 1,
              lambda z: 1 / (mp.erf(sq(z)) / sq(z) if z > 0 else 2 / sq(mp.pi)), 0.0, 1.0, 6),
    # ln erfc(1 + t), t in [0, 2.9375], weighted by erfc (the error it makes in erf)
    "ERFC_LOG": (lambda t: mp.log(mp.erfc(t + 1)), lambda t: mp.erfc(t + 1), 0.0, 2.9375, 7),
    # sin(r) = r + r z S(z), z = r^2 on [0, 0.79]
    "SIN_S": (lambda z: (mp.sin(sq(z)) - sq(z)) / (sq(z) * z) if z > 0 else -mp.mpf(1) / 6,
              lambda z: z / (mp.sin(sq(z)) / sq(z)) if z > 0 else mp.mpf(0), 0.0, 0.79 ** 2, 2),
    # cos(r) = 1 - z/2 + z^2 C(z) on [0, 0.79]
    "COS_C": (lambda z: (mp.cos(sq(z)) - 1 + z / 2) / (z * z) if z > 0 else mp.mpf(1) / 24,
              lambda z: z * z / mp.cos(sq(z)), 0.0, 0.79 ** 2, 2),
}

if __name__ == "__main__":
    for name, (f, w, lo, hi, deg) in FITS.items():
        c, err = fit(f, w, lo, hi, deg)
        # Shortest literals that round-trip to the f32 coefficients.
        lits = ", ".join(np.format_float_positional(v, unique=True) if 1e-3 <= abs(v) < 1e3
                         else np.format_float_scientific(v, unique=True) for v in reversed(c))
        print(f"{name} (highest degree first; fit error {err:.4f} ulp): [{lits}]")
