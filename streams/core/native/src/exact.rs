//! Exact float sums (the twin of streams/_exact.py) and Python's `int / int`.

/// Adds finite `x` to the Shewchuk expansion `parts` in place, exactly
/// (the same steps as `core.exact.grow`).
pub fn grow(parts: &mut Vec<f64>, mut x: f64) {
    let mut i = 0;
    for j in 0..parts.len() {
        let mut y = parts[j];
        if x.abs() < y.abs() {
            std::mem::swap(&mut x, &mut y);
        }
        let hi = x + y;
        let lo = y - (hi - x);
        if lo != 0.0 {
            parts[i] = lo;
            i += 1;
        }
        x = hi;
    }
    parts.truncate(i);
    parts.push(x);
}

/// `n / d` correctly rounded to the nearest double, ties to even: what Python's
/// true division of two ints gives (a plain f64 division rounds twice once an
/// operand passes 2^53). `d` > 0.
pub fn div(n: u128, d: u128) -> f64 {
    if n == 0 {
        return 0.0;
    }
    if n < (1 << 53) && d < (1 << 53) {
        return n as f64 / d as f64; // both exact: one rounding
    }
    // Scale so the integer quotient has 55..=56 significant bits, then round once.
    let nbits = 128 - n.leading_zeros() as i32;
    let dbits = 128 - d.leading_zeros() as i32;
    let shift = 55 - (nbits - dbits); // quotient ~ 2^(nbits - dbits + shift) ~ 2^55
    let (num, den) = if shift >= 0 {
        // n << shift fits: nbits + shift = 55 + dbits <= 183 would not, so widen via splitting
        widen_div(n, d, shift as u32)
    } else {
        let s = (-shift) as u32;
        // dividing by d << s, keeping the bits of n shifted out as sticky
        widen_div_down(n, d, s)
    };
    let (q, sticky) = (num, den);
    // q has 55 or 56 bits; round to 53 with the sticky bit
    let qbits = 128 - q.leading_zeros() as i32;
    let extra = qbits - 53;
    let mut mant = q >> extra;
    let rest = q & ((1u128 << extra) - 1);
    let half = 1u128 << (extra - 1);
    if rest > half || (rest == half && (sticky || mant & 1 == 1)) {
        mant += 1;
    }
    let exp = extra - shift; // value = mant * 2^(extra - shift)
    (mant as f64) * 2f64.powi(exp)
}

/// (floor(n * 2^shift / d), remainder != 0), with n * 2^shift computed by long division.
fn widen_div(n: u128, d: u128, shift: u32) -> (u128, bool) {
    // long division, one bit at a time: the quotient is at most 56 bits wide
    let mut q: u128 = n / d;
    let mut r: u128 = n % d;
    for _ in 0..shift {
        // r < d < 2^128: r * 2 may overflow, compare with d - r instead
        q <<= 1;
        if r >= d - r {
            r = r - (d - r);
            q |= 1;
        } else {
            r <<= 1;
        }
    }
    (q, r != 0)
}

/// (floor(n / (d * 2^s)), remainder != 0).
fn widen_div_down(n: u128, d: u128, s: u32) -> (u128, bool) {
    let q = n / d;
    let r = n % d;
    if s >= 128 {
        return (0, q != 0 || r != 0);
    }
    let out = q >> s;
    let lost = q & ((1u128 << s) - 1);
    (out, lost != 0 || r != 0)
}
