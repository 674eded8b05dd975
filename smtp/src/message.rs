//! The message (RFC 5322 / MIME, 7-bit) and the address checks.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use crate::{EmailMessage, SmtpError, Stage, Stamp};

/// A parsed `Name <addr>` or bare `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mailbox {
    name: Option<String>,
    pub(crate) addr: String,
}

pub(crate) fn parse_mailbox(raw: &str, what: &str) -> Result<Mailbox, SmtpError> {
    let bad = |why: &str| SmtpError::ours(Stage::Message, format!("the {what} address {why}"));
    if raw.chars().any(char::is_control) {
        return Err(bad("contains a control character"));
    }
    let raw = raw.trim();
    let (name, addr) = match (raw.rfind('<'), raw.strip_suffix('>')) {
        (Some(open), Some(without_close)) => {
            let name = without_close.get(..open).unwrap_or_default().trim();
            let addr = without_close
                .get(open.saturating_add(1)..)
                .unwrap_or_default();
            let name = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
                Some(quoted) => unescape_quoted(quoted),
                None => name.to_string(),
            };
            let name = name.trim();
            ((!name.is_empty()).then(|| name.to_string()), addr.trim())
        }
        (None, None) => (None, raw),
        _ => return Err(bad("is not of the form Name <local@domain>")),
    };
    if let Some(name) = &name {
        if name.chars().count() > 200 {
            return Err(bad("has a display name longer than 200 characters"));
        }
    }
    check_address(addr).map_err(bad)?;
    Ok(Mailbox {
        name,
        addr: addr.to_string(),
    })
}

/// The content of a quoted string, a backslash escaping the next character.
fn unescape_quoted(quoted: &str) -> String {
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// A plain ASCII `local@domain`: dot-atom local part (RFC 5322 atext), a
/// host-name domain; at most 64 + 255 characters, 254 in all.
fn check_address(addr: &str) -> Result<(), &'static str> {
    if addr.is_empty() {
        return Err("is empty");
    }
    if addr.len() > 254 {
        return Err("is longer than 254 characters");
    }
    let Some((local, domain)) = addr.rsplit_once('@') else {
        return Err("has no @");
    };
    if local.is_empty() || local.len() > 64 {
        return Err("has an empty or too long local part");
    }
    let atext = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c);
    if local
        .split('.')
        .any(|atom| atom.is_empty() || !atom.chars().all(atext))
    {
        return Err("has an unsupported local part (only plain ASCII dot-atoms are accepted)");
    }
    if !is_host_name(domain) {
        return Err("has an invalid domain");
    }
    Ok(())
}

/// Letters, digits and hyphens in dot-separated labels of 1..=63
/// characters, not starting or ending with a hyphen; 255 characters at most.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

pub(crate) fn check_client_name(name: &str) -> Result<(), SmtpError> {
    let literal = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .is_some_and(|inner| {
            let inner = inner.strip_prefix("IPv6:").unwrap_or(inner);
            !inner.is_empty()
                && inner.len() <= 45
                && inner
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == '.' || c == ':')
        });
    if literal || is_host_name(name) {
        Ok(())
    } else {
        Err(SmtpError::ours(
            Stage::Message,
            "the EHLO client name must be a host name or an address literal",
        ))
    }
}

/// Formats the complete message (headers and MIME body) with CRLF line
/// ends, before dot-stuffing.
pub fn format_message(message: &EmailMessage, stamp: &Stamp) -> Result<Vec<u8>, SmtpError> {
    let from = parse_mailbox(&message.from, "sender")?;
    let to = parse_mailbox(&message.to, "recipient")?;
    if message.subject.contains(['\r', '\n']) {
        return Err(SmtpError::ours(
            Stage::Message,
            "the subject contains a line break",
        ));
    }
    let (id_bytes, boundary_bytes) = stamp.random.split_at(16);
    let domain = from
        .addr
        .rsplit_once('@')
        .map(|(_, d)| d)
        .unwrap_or("localhost");
    let boundary = format!("=_tfa_{}", hex(boundary_bytes));

    let mut out = String::new();
    let mut header = |name: &str, value: &str| {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    };
    header("Date", &rfc5322_date(stamp.unix_secs));
    header("From", &format_mailbox(&from));
    header("To", &format_mailbox(&to));
    header("Subject", &encode_unstructured(&message.subject, "Subject"));
    header("Message-ID", &format!("<{}@{domain}>", hex(id_bytes)));
    header("MIME-Version", "1.0");
    header(
        "Content-Type",
        &format!("multipart/alternative;\r\n boundary=\"{boundary}\""),
    );
    out.push_str("\r\n");
    for (subtype, body) in [("plain", &message.text), ("html", &message.html)] {
        out.push_str("--");
        out.push_str(&boundary);
        out.push_str("\r\n");
        out.push_str("Content-Type: text/");
        out.push_str(subtype);
        out.push_str("; charset=utf-8\r\n");
        out.push_str("Content-Transfer-Encoding: quoted-printable\r\n\r\n");
        out.push_str(&quoted_printable(body));
        out.push_str("\r\n");
    }
    out.push_str("--");
    out.push_str(&boundary);
    out.push_str("--\r\n");
    Ok(out.into_bytes())
}

fn format_mailbox(mailbox: &Mailbox) -> String {
    match &mailbox.name {
        None => mailbox.addr.clone(),
        Some(name) => {
            let plain = name.chars().all(|c| (' '..='~').contains(&c)) && name.len() <= 60;
            let shown = if plain {
                let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
                format!("\"{escaped}\"")
            } else {
                // Folded encoded words, continuing on the address line.
                encode_words(name)
            };
            format!("{shown} <{}>", mailbox.addr)
        }
    }
}

/// A header value as is when it is short printable ASCII that cannot be
/// mistaken for an encoded word; otherwise RFC 2047 encoded words.
fn encode_unstructured(value: &str, header: &str) -> String {
    let start = header.len().saturating_add(2);
    let plain = value.chars().all(|c| (' '..='~').contains(&c))
        && !value.contains("=?")
        && value.len().saturating_add(start) <= 78;
    if plain {
        value.to_string()
    } else {
        encode_words(value)
    }
}

/// `=?UTF-8?B?…?=` words of at most 64 characters (39 bytes of text each,
/// never splitting a character), folded with CRLF + space.
fn encode_words(value: &str) -> String {
    let mut words = Vec::new();
    let mut chunk = String::new();
    for c in value.chars() {
        if chunk.len().saturating_add(c.len_utf8()) > 39 {
            words.push(format!("=?UTF-8?B?{}?=", B64.encode(&chunk)));
            chunk.clear();
        }
        chunk.push(c);
    }
    if !chunk.is_empty() || words.is_empty() {
        words.push(format!("=?UTF-8?B?{}?=", B64.encode(&chunk)));
    }
    words.join("\r\n ")
}

/// Quoted-printable (RFC 2045 section 6.7) of UTF-8 text: any line break
/// (CRLF, LF or CR) becomes a hard CRLF, lines are at most 76 characters
/// with soft breaks, trailing white space and `=` are encoded.
pub fn quoted_printable(text: &str) -> String {
    let normalised = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = String::with_capacity(normalised.len().saturating_add(normalised.len() / 8));
    for (i, line) in normalised.split('\n').enumerate() {
        if i > 0 {
            out.push_str("\r\n");
        }
        let bytes = line.as_bytes();
        let mut width = 0usize;
        for (j, &b) in bytes.iter().enumerate() {
            let is_last = j.saturating_add(1) == bytes.len();
            let literal =
                matches!(b, b'!'..=b'<' | b'>'..=b'~') || (matches!(b, b' ' | b'\t') && !is_last);
            let token = if literal {
                char::from(b).to_string()
            } else {
                format!("={b:02X}")
            };
            if width.saturating_add(token.len()) > 75 {
                out.push_str("=\r\n");
                width = 0;
            }
            width = width.saturating_add(token.len());
            out.push_str(&token);
        }
    }
    out
}

/// CRLF line ends everywhere (a lone CR or LF becomes CRLF), a `.` doubled
/// at the start of every line, and the `CRLF . CRLF` terminator.
pub fn dot_stuff(content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        content
            .len()
            .saturating_add(content.len() / 32)
            .saturating_add(5),
    );
    let mut at_line_start = true;
    let mut iter = content.iter().peekable();
    while let Some(&b) = iter.next() {
        match b {
            b'\r' => {
                if iter.peek() == Some(&&b'\n') {
                    iter.next();
                }
                out.extend_from_slice(b"\r\n");
                at_line_start = true;
            }
            b'\n' => {
                out.extend_from_slice(b"\r\n");
                at_line_start = true;
            }
            _ => {
                if at_line_start && b == b'.' {
                    out.push(b'.');
                }
                out.push(b);
                at_line_start = false;
            }
        }
    }
    if !at_line_start {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `Thu, 01 Jan 1970 00:00:00 +0000` for a Unix time in UTC (clamped to
/// the year 9999).
#[allow(clippy::arithmetic_side_effects, clippy::indexing_slicing)]
// Bounded: `secs` is clamped below 2.6e11, so every intermediate fits in
// i64, divisors are non-zero constants, and the table indexes are reduced
// modulo 7 and 1..=12.
pub fn rfc5322_date(unix_secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = i64::try_from(unix_secs.min(253_402_300_799)).unwrap_or(0);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from a day count (proleptic Gregorian calendar), computed
    // over 400-year eras of 146097 days, with years starting in March.
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year:04} {hour:02}:{minute:02}:{second:02} +0000",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
    )
}
