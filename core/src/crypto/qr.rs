//! QR code of a text, as a `data:image/png;base64,...` URL that a page can show directly
//! (for the `otpauth://` URI of TOTP enrolment).
//!
//! What it does: encodes the text with `qrcodegen` (error correction at least Medium),
//! draws it with a 4-module quiet zone at 5 pixels per module, and writes a
//! 1-bit grayscale PNG with a small encoder of its own (signature, IHDR, one IDAT, IEND;
//! CRC-32 per chunk; the pixels in a zlib stream of stored, i.e. uncompressed, deflate
//! blocks with an Adler-32 trailer).
//!
//! What it does not do: no compression (a 1-bit image of a QR code is a few KiB anyway),
//! no colours, no other image formats, no decoding, and no I/O.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use qrcodegen::{QrCode, QrCodeEcc};

/// Pixels per QR module, in both directions.
const SCALE: u32 = 5;

/// Width of the light border around the symbol, in modules (the minimum the QR
/// standard asks for).
const QUIET_ZONE: u32 = 4;

/// Why [`qr_data_url`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QrError {
    /// The text does not fit in the largest QR code (version 40) at error correction
    /// level Medium: about 2331 bytes of arbitrary UTF-8, more for digits only.
    TooLong,
}

/// Returns `data:image/png;base64,...`: a PNG of the QR code of `text`.
///
/// The code uses error correction level Medium (raised to a higher level when that fits
/// in the same size), is surrounded by a 4-module light quiet zone and drawn at
/// 5 pixels per module (`SCALE`) as a 1-bit grayscale image (dark modules black).
///
/// # Errors
/// [`QrError::TooLong`] if the text does not fit in a QR code.
pub fn qr_data_url(text: &str) -> Result<String, QrError> {
    let qr = QrCode::encode_text(text, QrCodeEcc::Medium).map_err(|_| QrError::TooLong)?;
    // The size is 21..=177 modules, so the image is at most 925 pixels wide.
    let modules = qr.size().unsigned_abs();
    let side = (modules + 2 * QUIET_ZONE) * SCALE;
    // The module under a pixel, or `None` in the quiet zone before the symbol.
    let module_at = |pixel: u32| {
        (pixel / SCALE)
            .checked_sub(QUIET_ZONE)
            .and_then(|m| i32::try_from(m).ok())
    };
    let png = png_writer::encode_gray1(side, side, |x, y| match (module_at(x), module_at(y)) {
        // `get_module` also reports coordinates past the symbol as light.
        (Some(mx), Some(my)) => !qr.get_module(mx, my),
        _ => true,
    });
    Ok(format!("data:image/png;base64,{}", STANDARD.encode(png)))
}

/// A minimal PNG encoder: 1-bit grayscale, no interlacing, filter type None,
/// uncompressed (stored) deflate blocks.
mod png_writer {
    /// The 8-byte PNG signature.
    const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

    /// The largest payload of one stored deflate block.
    const MAX_STORED_BLOCK: usize = 0xffff;

    /// Encodes a `width` × `height` black-and-white image as a PNG file; `light(x, y)`
    /// tells whether the pixel at column `x`, row `y` is white.
    pub(super) fn encode_gray1(
        width: u32,
        height: u32,
        light: impl Fn(u32, u32) -> bool,
    ) -> Vec<u8> {
        // Scanlines: a filter-type byte (0, None), then the pixels, 8 per byte, most
        // significant bit first; the unused low bits of a row's last byte stay 0.
        let row_bytes = width.div_ceil(8) as usize;
        let mut raw = Vec::with_capacity((row_bytes + 1) * height as usize);
        for y in 0..height {
            raw.push(0);
            let start = raw.len();
            raw.resize(start + row_bytes, 0);
            for x in 0..width {
                if light(x, y) {
                    raw[start + (x / 8) as usize] |= 0x80 >> (x % 8);
                }
            }
        }

        let mut ihdr = Vec::with_capacity(13);
        ihdr.extend_from_slice(&width.to_be_bytes());
        ihdr.extend_from_slice(&height.to_be_bytes());
        // Bit depth 1, colour type 0 (grayscale), compression 0 (deflate), filter
        // method 0, interlace 0 (none).
        ihdr.extend_from_slice(&[1, 0, 0, 0, 0]);

        let mut out = Vec::with_capacity(raw.len() + raw.len() / MAX_STORED_BLOCK * 5 + 64);
        out.extend_from_slice(&SIGNATURE);
        write_chunk(&mut out, b"IHDR", &ihdr);
        write_chunk(&mut out, b"IDAT", &zlib_stored(&raw));
        write_chunk(&mut out, b"IEND", &[]);
        out
    }

    /// Appends a chunk: length (big-endian), type, data, CRC-32 of type and data.
    fn write_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        // Our chunks are far below the 2^31 - 1 bytes PNG allows.
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }

    /// A zlib stream (RFC 1950) of `data` in stored deflate blocks (RFC 1951 §3.2.4).
    pub(super) fn zlib_stored(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len() + data.len() / MAX_STORED_BLOCK * 5 + 16);
        // CMF 0x78: deflate, 32 KiB window. FLG 0x01: no dictionary, "fastest"
        // level, and check bits making 0x7801 a multiple of 31.
        out.extend_from_slice(&[0x78, 0x01]);
        let mut blocks = data.chunks(MAX_STORED_BLOCK).peekable();
        if blocks.peek().is_none() {
            // Empty data: one final, empty block.
            out.extend_from_slice(&[0x01, 0x00, 0x00, 0xff, 0xff]);
        }
        while let Some(block) = blocks.next() {
            // Header bits BFINAL and BTYPE = 00 (stored), then padding to the byte.
            out.push(u8::from(blocks.peek().is_none()));
            // `chunks` makes blocks of at most 0xffff bytes.
            let len = u16::try_from(block.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(block);
        }
        out.extend_from_slice(&adler32(data).to_be_bytes());
        out
    }

    /// CRC-32 (ISO-HDLC: reflected polynomial 0xEDB88320), as PNG chunks use it.
    pub(super) fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = u32::MAX;
        for &byte in bytes {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// Adler-32 (RFC 1950), the checksum at the end of a zlib stream.
    pub(super) fn adler32(bytes: &[u8]) -> u32 {
        const MOD: u32 = 65_521;
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in bytes {
            a = (a + u32::from(byte)) % MOD;
            b = (b + a) % MOD;
        }
        (b << 16) | a
    }
}

#[cfg(test)]
mod tests {
    use super::png_writer::{adler32, crc32, encode_gray1, zlib_stored};
    use super::*;

    const OTPAUTH: &str = "otpauth://totp/TwoFactorAuth:alice%40example.com?secret=JBSWY3DPEHPK3PXP&issuer=TwoFactorAuth&algorithm=SHA1&digits=6&period=30";

    /// A decoded PNG: width, height, one byte per pixel (0 black, 255 white).
    struct Gray {
        width: usize,
        height: usize,
        pixels: Vec<u8>,
    }

    /// Decodes a PNG with the `png` crate, expanding 1-bit gray to 8-bit.
    fn decode_png(bytes: &[u8]) -> Gray {
        let mut decoder = png::Decoder::new(bytes);
        decoder.set_transformations(png::Transformations::EXPAND);
        let mut reader = decoder.read_info().expect("PNG header");
        let info = reader.info();
        assert_eq!(info.bit_depth, png::BitDepth::One);
        assert_eq!(info.color_type, png::ColorType::Grayscale);
        assert!(!info.interlaced);
        let mut pixels = vec![0; reader.output_buffer_size()];
        let frame = reader.next_frame(&mut pixels).expect("PNG data");
        assert_eq!(frame.color_type, png::ColorType::Grayscale);
        assert_eq!(frame.bit_depth, png::BitDepth::Eight);
        pixels.truncate(frame.buffer_size());
        Gray {
            width: frame.width as usize,
            height: frame.height as usize,
            pixels,
        }
    }

    /// The PNG inside a data URL.
    fn png_of(url: &str) -> Vec<u8> {
        let b64 = url
            .strip_prefix("data:image/png;base64,")
            .expect("data URL prefix");
        STANDARD.decode(b64).expect("base64")
    }

    /// Decodes the QR codes in an image with `rqrr`.
    fn read_qr(image: &Gray) -> Vec<String> {
        let mut prepared =
            rqrr::PreparedImage::prepare_from_greyscale(image.width, image.height, |x, y| {
                image.pixels[y * image.width + x]
            });
        prepared
            .detect_grids()
            .iter()
            .map(|grid| grid.decode().expect("QR decodes").1)
            .collect()
    }

    fn round_trip(text: &str) -> Gray {
        let url = qr_data_url(text).expect("fits");
        let image = decode_png(&png_of(&url));
        assert_eq!(read_qr(&image), vec![text.to_owned()]);
        image
    }

    #[test]
    fn otpauth_uri_round_trips_through_png_and_a_qr_reader() {
        let image = round_trip(OTPAUTH);
        assert_eq!(image.width, image.height);
        // A whole number of modules, with the symbol size of a QR version (17 + 4v).
        assert_eq!(image.width % SCALE as usize, 0);
        let modules = image.width / SCALE as usize - 2 * QUIET_ZONE as usize;
        assert_eq!((modules - 17) % 4, 0);
    }

    #[test]
    fn quiet_zone_is_light_and_symbol_corner_is_dark() {
        let image = round_trip(OTPAUTH);
        let border = (QUIET_ZONE * SCALE) as usize;
        let w = image.width;
        for y in 0..image.height {
            for x in 0..w {
                let in_border =
                    x < border || y < border || x >= w - border || y >= image.height - border;
                if in_border {
                    assert_eq!(image.pixels[y * w + x], 255, "({x}, {y})");
                }
            }
        }
        // The outer ring of the top-left finder pattern is dark.
        assert_eq!(image.pixels[border * w + border], 0);
        // Only pure black and white.
        assert!(image.pixels.iter().all(|&p| p == 0 || p == 255));
    }

    #[test]
    fn other_texts_round_trip() {
        round_trip("");
        round_trip("hello");
        round_trip("0123456789");
        round_trip("héllo wörld — ünïcödé ✓");
        // Large enough for the scanlines to need several stored deflate blocks.
        let long: String = (0..1500)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let image = round_trip(&long);
        assert!((image.width.div_ceil(8) + 1) * image.height > 0xffff);
    }

    #[test]
    fn too_long_text_is_refused() {
        assert!(qr_data_url(&"a".repeat(2331)).is_ok());
        assert_eq!(qr_data_url(&"a".repeat(2332)), Err(QrError::TooLong));
        assert_eq!(qr_data_url(&"a".repeat(10_000)), Err(QrError::TooLong));
    }

    #[test]
    fn crc32_known_values() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"IEND"), 0xae42_6082);
    }

    #[test]
    fn adler32_known_values() {
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
        assert_eq!(adler32(b""), 1);
        // Long enough for both sums to wrap around the modulus many times.
        assert_eq!(
            adler32(&[0xff; 100_000]),
            adler32_reference(&[0xff; 100_000])
        );
    }

    /// Adler-32 straight from its definition, with wide integers and no running modulus.
    fn adler32_reference(bytes: &[u8]) -> u32 {
        let n = bytes.len() as u128;
        let a: u128 = 1 + bytes.iter().map(|&b| u128::from(b)).sum::<u128>();
        let b: u128 = n + bytes
            .iter()
            .enumerate()
            .map(|(i, &d)| (n - i as u128) * u128::from(d))
            .sum::<u128>();
        (((b % 65_521) << 16) | (a % 65_521)) as u32
    }

    #[test]
    fn zlib_stored_exact_bytes() {
        assert_eq!(
            zlib_stored(b""),
            [0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01]
        );
        assert_eq!(
            zlib_stored(b"abc"),
            [0x78, 0x01, 0x01, 0x03, 0x00, 0xfc, 0xff, b'a', b'b', b'c', 0x02, 0x4d, 0x01, 0x27]
        );
        assert_eq!(u16::from_be_bytes([0x78, 0x01]) % 31, 0);
    }

    /// Reads a zlib stream of stored blocks back, checking every field.
    fn inflate_stored(stream: &[u8]) -> (Vec<u8>, usize) {
        assert_eq!(&stream[..2], &[0x78, 0x01]);
        let mut pos = 2;
        let mut out = Vec::new();
        let mut blocks = 0;
        loop {
            let header = stream[pos];
            assert_eq!(header & !1, 0, "stored block header");
            let len = u16::from_le_bytes([stream[pos + 1], stream[pos + 2]]);
            let nlen = u16::from_le_bytes([stream[pos + 3], stream[pos + 4]]);
            assert_eq!(nlen, !len);
            pos += 5;
            out.extend_from_slice(&stream[pos..pos + usize::from(len)]);
            pos += usize::from(len);
            blocks += 1;
            if header == 1 {
                break;
            }
        }
        let adler = u32::from_be_bytes(stream[pos..pos + 4].try_into().unwrap());
        assert_eq!(adler, adler32(&out));
        assert_eq!(pos + 4, stream.len());
        (out, blocks)
    }

    #[test]
    fn zlib_stored_splits_into_blocks_of_at_most_65535_bytes() {
        for (len, expected_blocks) in [
            (0, 1),
            (1, 1),
            (0xffff, 1),
            (0x10000, 2),
            (2 * 0xffff, 2),
            (2 * 0xffff + 1, 3),
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let (back, blocks) = inflate_stored(&zlib_stored(&data));
            assert_eq!(back, data, "{len}");
            assert_eq!(blocks, expected_blocks, "{len}");
        }
    }

    #[test]
    fn png_encoder_structure() {
        let png = encode_gray1(3, 2, |x, y| (x + y) % 2 == 0);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: length 13, type, width 3, height 2, depth 1, gray, 0, 0, 0.
        assert_eq!(&png[8..16], b"\x00\x00\x00\x0dIHDR");
        assert_eq!(&png[16..29], &[0, 0, 0, 3, 0, 0, 0, 2, 1, 0, 0, 0, 0]);
        assert_eq!(&png[29..33], &crc32(&png[12..29]).to_be_bytes());
        // IDAT: the two scanlines, each a filter byte then the bits 101 / 010.
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        assert_eq!(&png[37..41], b"IDAT");
        let (raw, _) = inflate_stored(&png[41..41 + idat_len]);
        assert_eq!(raw, [0, 0b1010_0000, 0, 0b0100_0000]);
        let end = 41 + idat_len;
        assert_eq!(&png[end..end + 4], &crc32(&png[37..end]).to_be_bytes());
        // IEND, the last 12 bytes of every PNG.
        assert_eq!(
            &png[end + 4..],
            &[0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xae, 0x42, 0x60, 0x82]
        );
    }

    #[test]
    fn png_encoder_output_decodes_with_the_png_crate() {
        // Widths around a byte boundary, and an image larger than one stored block.
        for (w, h) in [(1, 1), (7, 3), (8, 2), (9, 5), (17, 4), (700, 800)] {
            let light = |x: u32, y: u32| (x * 3 + y * 5) % 7 < 3;
            let image = decode_png(&encode_gray1(w, h, light));
            assert_eq!((image.width, image.height), (w as usize, h as usize));
            for y in 0..h {
                for x in 0..w {
                    let expected = if light(x, y) { 255 } else { 0 };
                    assert_eq!(image.pixels[(y * w + x) as usize], expected, "({x}, {y})");
                }
            }
        }
    }
}
