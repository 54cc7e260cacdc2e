//! The personal-data rules: e-mail addresses (at each `@`), phone numbers and payment
//! cards (at the start of each number), IBANs (at two capitals and two digits).

use super::{Finding, Kind, Kinds, Scan, alnum, ends_word, run, sort, starts_word};

/// Bytes that may start a number (`0-9`, `+`, `(`) or an IBAN (`A-Z`).
static STARTS: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_digit() || b == b'+' || b == b'(' || b.is_ascii_uppercase();
        c += 1;
    }
    t
};

/// Finds the personal-data `kinds` in `b` into `out` (appended, then in order).
pub(super) fn scan(b: &[u8], kinds: Kinds, out: &mut Scan) {
    let from = out.findings.len();
    if kinds.has(Kind::Email) {
        let mut floor = 0;
        for at in memchr::memchr_iter(b'@', b) {
            if let Some(f) = email(b, at, floor) {
                floor = f.end;
                if !out.push(f) {
                    return;
                }
            }
        }
    }
    let emails = out.findings.len();
    let numbers = kinds.has(Kind::Phone) || kinds.has(Kind::PaymentCard);
    let iban = kinds.has(Kind::Iban);
    let mut i = 0;
    while i < b.len() {
        let Some(skip) = b[i..].iter().position(|c| STARTS[usize::from(*c)]) else {
            break;
        };
        i += skip;
        let c = b[i];
        let start = starts_word(b, i, |p| alnum(p) || p == b'+') && !inside_number(b, i);
        let f = if !start {
            None
        } else if c.is_ascii_uppercase() {
            if iban { self::iban(b, i) } else { None }
        } else if numbers {
            number(b, i, kinds)
        } else {
            None
        };
        match f {
            Some(f) => {
                i = f.end;
                if !out.push(f) {
                    return;
                }
            }
            None => i += 1,
        }
    }
    if emails > from && out.findings.len() > emails {
        sort(&mut out.findings[from..]);
    }
}

/// Whether `i` continues a dotted or dashed run of digits (`4.212.555.0143`, a version; the
/// tail of a longer number), where no phone or card number starts.
fn inside_number(b: &[u8], i: usize) -> bool {
    i >= 2 && matches!(b[i - 1], b'.' | b'-') && b[i - 2].is_ascii_digit()
}

/// A card number, else a phone number, starting at `i`.
fn number(b: &[u8], i: usize, kinds: Kinds) -> Option<Finding> {
    if kinds.has(Kind::PaymentCard)
        && b[i].is_ascii_digit()
        && let Some(f) = card(b, i)
    {
        return Some(f);
    }
    if kinds.has(Kind::Phone) { phone(b, i) } else { None }
}

// ---- e-mail ----

fn local_char(c: u8) -> bool {
    alnum(c) || matches!(c, b'.' | b'_' | b'%' | b'+' | b'-')
}

/// Domains reserved for examples and tests (RFC 2606, RFC 6761): not anyone's address.
fn reserved(d: &[u8]) -> bool {
    let ends = |s: &[u8]| {
        d.len() >= s.len()
            && d[d.len() - s.len()..].eq_ignore_ascii_case(s)
            && (d.len() == s.len() || d[d.len() - s.len() - 1] == b'.')
    };
    [
        &b"example.com"[..],
        b"example.net",
        b"example.org",
        b"example",
        b"test",
        b"invalid",
        b"localhost",
    ]
    .iter()
    .any(|s| ends(s))
}

/// The address around the `@` at `at`: a local part of 1-64 characters (none of it before
/// `floor`, the end of the address before), a domain of two or more labels ending in a
/// top-level domain of letters.
fn email(b: &[u8], at: usize, floor: usize) -> Option<Finding> {
    let back = (at - floor).min(64);
    let mut start = at - (0..back).take_while(|k| local_char(b[at - 1 - k])).count();
    while start < at && b[start] == b'.' {
        start += 1;
    }
    if start == at || b[at - 1] == b'.' || in_url(b, start) {
        return None;
    }
    let (end, labels, last) = domain(b, at + 1)?;
    if labels < 2 || last < 2 || end - at - 1 > 253 || reserved(&b[at + 1..end]) {
        return None;
    }
    // `icon@2x.png`: an image's scale, not an address.
    let first = &b[at + 1..];
    let scale = run(b, at + 1, 4, |c| c.is_ascii_digit());
    if labels == 2 && scale > 0 && first.get(scale) == Some(&b'x') && first.get(scale + 1) == Some(&b'.') {
        return None;
    }
    // `git@github.com:org/repo`: an SSH remote, not an address.
    if b.get(end) == Some(&b':') && b.get(end + 1).is_some_and(|c| !c.is_ascii_whitespace()) {
        return None;
    }
    Some(Finding {
        kind: Kind::Email,
        start,
        end,
    })
}

/// Whether the text before `start` makes what follows a URL's user or password
/// (`https://user@host`, `redis://user:p~ss@host`): `://` ends the scheme right before the
/// run of characters (no space, `/` or `@`) that leads to it.
fn in_url(b: &[u8], start: usize) -> bool {
    let userinfo = (0..start.min(256))
        .take_while(|k| {
            let c = b[start - 1 - k];
            c > b' ' && !matches!(c, b'/' | b'@' | b'"' | b'\'')
        })
        .count();
    let i = start - userinfo;
    i >= 3 && &b[i - 3..i] == b"://"
}

/// The domain from `i`: its end, its number of labels and the length of the last (0 when
/// the last is not all letters).
fn domain(b: &[u8], mut i: usize) -> Option<(usize, usize, usize)> {
    let (mut labels, mut last, mut end) = (0, 0, i);
    loop {
        let n = run(b, i, 64, |c| alnum(c) || c == b'-');
        if n == 0 || n > 63 || b[i] == b'-' || b[i + n - 1] == b'-' {
            break;
        }
        labels += 1;
        end = i + n;
        last = if b[i..end].iter().all(u8::is_ascii_alphabetic) {
            n
        } else {
            0
        };
        if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(|c| alnum(*c)) {
            i = end + 1;
        } else {
            break;
        }
    }
    (labels > 0).then_some((end, labels, last))
}

// ---- payment cards ----

/// 13-19 digits in groups split by single spaces or dashes (one kind throughout), of a card
/// network's range for that length, Luhn-valid.
fn card(b: &[u8], i: usize) -> Option<Finding> {
    let mut digits = [0u8; 19];
    let (mut n, mut j, mut sep) = (0usize, i, None);
    while j < b.len() {
        let c = b[j];
        if c.is_ascii_digit() {
            if n == 19 {
                return None;
            }
            digits[n] = c - b'0';
            n += 1;
            j += 1;
        } else if matches!(c, b' ' | b'-')
            && b.get(j + 1).is_some_and(u8::is_ascii_digit)
            && sep.is_none_or(|s| s == c)
        {
            sep = Some(c);
            j += 1;
        } else {
            break;
        }
    }
    if !(13..=19).contains(&n) || !ends_word(b, j, alnum) || !network(&digits[..n]) || !luhn(&digits[..n]) {
        return None;
    }
    Some(Finding {
        kind: Kind::PaymentCard,
        start: i,
        end: j,
    })
}

/// Whether the number's prefix and length belong to a card network: Visa, Mastercard,
/// American Express, Discover, JCB, Diners Club, UnionPay, Maestro.
fn network(d: &[u8]) -> bool {
    let prefix = |k: usize| d[..k].iter().fold(0u32, |a, x| a * 10 + u32::from(*x));
    let (len, p2, p3, p4) = (d.len(), prefix(2), prefix(3), prefix(4));
    match d[0] {
        4 => matches!(len, 13 | 16 | 19),
        2 => len == 16 && (2221..=2720).contains(&p4),
        5 => (len == 16 && (51..=55).contains(&p2)) || (matches!(p2, 50 | 56..=58) && len >= 12),
        3 => {
            (len == 15 && matches!(p2, 34 | 37))
                || ((3528..=3589).contains(&p4) && len >= 16)
                || (len >= 14 && ((300..=305).contains(&p3) || matches!(p2, 36 | 38 | 39)))
        }
        6 => {
            (len >= 16 && (p4 == 6011 || (644..=649).contains(&p3) || p2 == 65 || p2 == 62))
                || (len >= 12 && matches!(p2, 63 | 67 | 69))
        }
        _ => false,
    }
}

fn luhn(d: &[u8]) -> bool {
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(k, x)| {
            let x = u32::from(*x);
            if k % 2 == 1 {
                if x * 2 > 9 { x * 2 - 9 } else { x * 2 }
            } else {
                x
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

// ---- phone numbers ----

/// `+` and a country code, then 8-15 digits in all, split by single spaces, dashes, dots or
/// one parenthesized group; or a North American number with its area code:
/// `(NXX) NXX-XXXX`, `NXX-NXX-XXXX`, `NXX.NXX.XXXX`.
fn phone(b: &[u8], i: usize) -> Option<Finding> {
    match b[i] {
        b'+' => international(b, i),
        b'(' => north_american(b, i, true),
        _ => north_american(b, i, false),
    }
}

fn international(b: &[u8], i: usize) -> Option<Finding> {
    if !b.get(i + 1).is_some_and(|c| (b'1'..=b'9').contains(c)) {
        return None;
    }
    let (mut n, mut j, mut open) = (0, i + 1, false);
    // After the last digit, and whether a parenthesis was open there.
    let (mut end, mut open_at_end) = (j, false);
    while j < b.len() {
        let c = b[j];
        let next_digit = b.get(j + 1).is_some_and(u8::is_ascii_digit);
        match c {
            b'0'..=b'9' => {
                n += 1;
                (end, open_at_end) = (j + 1, open);
            }
            b' ' | b'-' | b'.' if next_digit || (b.get(j + 1) == Some(&b'(') && !open) => {}
            b'(' if !open && next_digit => open = true,
            b')' if open => {
                open = false;
                if b.get(j + 1) == Some(&b' ') && b.get(j + 2).is_some_and(u8::is_ascii_digit) {
                    j += 1;
                }
            }
            _ => break,
        }
        j += 1;
        if n > 15 {
            return None;
        }
    }
    let ok = (8..=15).contains(&n) && !open_at_end && ends_word(b, end, alnum);
    ok.then_some(Finding {
        kind: Kind::Phone,
        start: i,
        end,
    })
}

fn north_american(b: &[u8], i: usize, paren: bool) -> Option<Finding> {
    let three = |k: usize, first_digit: bool| {
        run(b, k, 4, |c| c.is_ascii_digit()) == 3 && (!first_digit || b[k] >= b'2')
    };
    let (area, mut j) = if paren { (i + 1, i + 4) } else { (i, i + 3) };
    if !three(area, true) {
        return None;
    }
    let sep = if paren {
        if b.get(j) != Some(&b')') {
            return None;
        }
        j += 1;
        match b.get(j) {
            Some(b' ') => {
                j += 1;
                None
            }
            Some(b'-') => {
                j += 1;
                None
            }
            _ => None,
        }
    } else {
        let s = *b.get(j).filter(|c| matches!(c, b'-' | b'.'))?;
        j += 1;
        Some(s)
    };
    if !three(j, true) {
        return None;
    }
    j += 3;
    let joiner = sep.unwrap_or(b'-');
    if b.get(j) != Some(&joiner) || run(b, j + 1, 5, |c| c.is_ascii_digit()) != 4 {
        return None;
    }
    let end = j + 5;
    // Not the start of a longer dotted or dashed run (`415.555.0132.7`, a version).
    let longer = matches!(b.get(end), Some(b'.' | b'-')) && b.get(end + 1).is_some_and(u8::is_ascii_digit);
    (!longer && ends_word(b, end, alnum)).then_some(Finding {
        kind: Kind::Phone,
        start: i,
        end,
    })
}

// ---- IBAN ----

/// IBAN lengths by country (the IBAN registry).
const IBAN_LENGTHS: &[(&[u8; 2], usize)] = &[
    (b"AD", 24),
    (b"AE", 23),
    (b"AL", 28),
    (b"AT", 20),
    (b"AZ", 28),
    (b"BA", 20),
    (b"BE", 16),
    (b"BG", 22),
    (b"BH", 22),
    (b"BR", 29),
    (b"BY", 28),
    (b"CH", 21),
    (b"CR", 22),
    (b"CY", 28),
    (b"CZ", 24),
    (b"DE", 22),
    (b"DK", 18),
    (b"DO", 28),
    (b"EE", 20),
    (b"EG", 29),
    (b"ES", 24),
    (b"FI", 18),
    (b"FO", 18),
    (b"FR", 27),
    (b"GB", 22),
    (b"GE", 22),
    (b"GI", 23),
    (b"GL", 18),
    (b"GR", 27),
    (b"GT", 28),
    (b"HR", 21),
    (b"HU", 28),
    (b"IE", 22),
    (b"IL", 23),
    (b"IQ", 23),
    (b"IS", 26),
    (b"IT", 27),
    (b"JO", 30),
    (b"KW", 30),
    (b"KZ", 20),
    (b"LB", 28),
    (b"LC", 32),
    (b"LI", 21),
    (b"LT", 20),
    (b"LU", 20),
    (b"LV", 21),
    (b"MC", 27),
    (b"MD", 24),
    (b"ME", 22),
    (b"MK", 19),
    (b"MR", 27),
    (b"MT", 31),
    (b"MU", 30),
    (b"NL", 18),
    (b"NO", 15),
    (b"PK", 24),
    (b"PL", 28),
    (b"PS", 29),
    (b"PT", 25),
    (b"QA", 29),
    (b"RO", 24),
    (b"RS", 22),
    (b"SA", 24),
    (b"SC", 31),
    (b"SE", 24),
    (b"SI", 19),
    (b"SK", 24),
    (b"SM", 27),
    (b"ST", 25),
    (b"SV", 28),
    (b"TL", 23),
    (b"TN", 24),
    (b"TR", 26),
    (b"UA", 29),
    (b"VA", 22),
    (b"VG", 24),
    (b"XK", 20),
];

/// A country code, two check digits and the account, written whole or in groups of four
/// split by single spaces, of the country's length, mod 97 == 1.
fn iban(b: &[u8], i: usize) -> Option<Finding> {
    let head = b.get(i..i + 4)?;
    if !head[1].is_ascii_uppercase() || !head[2].is_ascii_digit() || !head[3].is_ascii_digit() {
        return None;
    }
    let len = IBAN_LENGTHS.iter().find(|(c, _)| c[..] == head[..2])?.1;
    let mut chars = [0u8; 34];
    let (mut n, mut j) = (0, i);
    let upper_or_digit = |c: u8| c.is_ascii_uppercase() || c.is_ascii_digit();
    while j < b.len() && n < len {
        let c = b[j];
        if upper_or_digit(c) {
            chars[n] = c;
            n += 1;
            j += 1;
        } else if c == b' ' && n % 4 == 0 && b.get(j + 1).is_some_and(|c| upper_or_digit(*c)) {
            j += 1;
        } else {
            break;
        }
    }
    if n != len || !ends_word(b, j, alnum) {
        return None;
    }
    let rotated = chars[4..n].iter().chain(&chars[..4]);
    let rem = rotated.fold(0u32, |r, c| {
        if c.is_ascii_digit() {
            (r * 10 + u32::from(c - b'0')) % 97
        } else {
            (r * 100 + u32::from(c - b'A' + 10)) % 97
        }
    });
    (rem == 1).then_some(Finding {
        kind: Kind::Iban,
        start: i,
        end: j,
    })
}
