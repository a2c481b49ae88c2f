// JPEG (libjpeg-turbo's libjpeg API) and PNG (libpng) decoding to RGB, as Pillow's convert("RGB").
#include "runtime/data/image_codec.h"

#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "runtime/core/error.h"

// After <cstdio> (jpeglib.h uses FILE and size_t without including their
// headers), jerror.h after jpeglib.h.
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

namespace fanout::data {

ImageFormat sniff_image(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::Jpeg;
  static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, png_magic, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

namespace {

// Pillow's CMYK to RGB: nk - c * nk / 255 (rounded as Pillow's MULDIV255), nk = 255 - k.
inline uint8_t cmyk_channel(int c, int nk) {
  const int t = c * nk + 128;
  return static_cast<uint8_t>(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255));
}

// Pillow's decompression-bomb bound: an error above twice Image.MAX_IMAGE_PIXELS,
// checked from the header before any pixel buffer is allocated.
constexpr int64_t kMaxImagePixels = 2 * int64_t{89478485};
void check_pixels(int64_t w, int64_t h, const std::string& name) {
  FANOUT_USER_CHECK(w * h <= kMaxImagePixels)
      << "cannot decode image " << name << ": " << w << "x" << h << " pixels, more than the limit of "
      << kMaxImagePixels << " (Pillow's decompression-bomb bound)";
}

// libjpeg's API with Pillow's rules (its JPEG decoder uses the same calls):
// an error (error_exit) refuses the file, warnings are ignored, except the
// data ending before the last row, which Pillow refuses ("image file is
// truncated"; once every row is out it stops reading without the EOI). A
// decompressor per call, so that no state outlives a failure (TurboJPEG's
// handle, reused after some errors, refused every later file, and counted
// an error after a warning as a warning).
struct JpegError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool rows_done;
};

[[noreturn]] void jpeg_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  c->err->format_message(c, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_emit_message(j_common_ptr c, int level) {
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF && !reinterpret_cast<JpegError*>(c->err)->rows_done)
    jpeg_error_exit(c);
}

struct Jpeg {
  jpeg_decompress_struct cinfo;
  JpegError err;
  Jpeg() {
    std::memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_error_exit;
    err.pub.emit_message = jpeg_emit_message;
    err.message[0] = '\0';
    err.rows_done = false;
  }
  ~Jpeg() { jpeg_destroy_decompress(&cinfo); }  // also after a failure at any point
  Jpeg(const Jpeg&) = delete;
  Jpeg& operator=(const Jpeg&) = delete;
};

struct JpegHeader {
  int width = 0, height = 0;
  bool cmyk = false;
};

// Reads the header and, with `out`, the pixels at 1/scale (RGB, or CMYK for
// CMYK and YCCK files) into *out, sizing it. Returns null, or libjpeg's
// message for a file it refuses. Nothing with a destructor lives in this
// frame: a failure leaves it by longjmp.
const char* read_jpeg(Jpeg& j, const uint8_t* data, size_t size, int scale, const std::string& name, JpegHeader& hd,
                      std::vector<uint8_t>* out) {
  jpeg_decompress_struct& ci = j.cinfo;
  if (setjmp(j.err.jump)) return j.err.message;
  jpeg_create_decompress(&ci);
  jpeg_mem_src(&ci, data, static_cast<unsigned long>(size));
  jpeg_read_header(&ci, TRUE);
  hd.width = static_cast<int>(ci.image_width);
  hd.height = static_cast<int>(ci.image_height);
  hd.cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
  check_pixels(hd.width, hd.height, name);
  if (!out) return nullptr;
  ci.out_color_space = hd.cmyk ? JCS_CMYK : JCS_RGB;
  ci.dct_method = JDCT_ISLOW;  // the accurate integer IDCT, as Pillow
  ci.scale_num = 1;
  ci.scale_denom = static_cast<unsigned>(scale);
  jpeg_start_decompress(&ci);
  const size_t stride = static_cast<size_t>(ci.output_width) * ci.output_components;
  out->resize(stride * ci.output_height);
  JSAMPROW rows[16];
  while (ci.output_scanline < ci.output_height) {
    const JDIMENSION n = std::min<JDIMENSION>(16, ci.output_height - ci.output_scanline);
    for (JDIMENSION r = 0; r < n; ++r) rows[r] = out->data() + (ci.output_scanline + r) * stride;
    jpeg_read_scanlines(&ci, rows, n);
  }
  j.err.rows_done = true;
  jpeg_finish_decompress(&ci);
  return nullptr;
}

JpegHeader jpeg_header(const uint8_t* data, size_t size, const std::string& name) {
  Jpeg j;
  JpegHeader hd;
  const char* failed = read_jpeg(j, data, size, 1, name, hd, nullptr);
  FANOUT_USER_CHECK(!failed) << "cannot decode image " << name << ": not a readable JPEG (" << failed << ")";
  return hd;
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int scale) {
  Jpeg j;
  JpegHeader hd;
  std::vector<uint8_t> buf;
  const char* failed = read_jpeg(j, data, size, scale, name, hd, &buf);
  FANOUT_USER_CHECK(!failed) << "cannot decode image " << name << ": not a readable JPEG (" << failed << ")";
  Image im;
  im.width = static_cast<int>(j.cinfo.output_width);
  im.height = static_cast<int>(j.cinfo.output_height);
  if (!hd.cmyk) {
    im.rgb = std::move(buf);
    return im;
  }
  // Pillow assumes Adobe's convention (inverted CMYK) for every CMYK JPEG.
  im.rgb.resize(static_cast<size_t>(im.width) * im.height * 3);
  for (size_t i = 0, n = static_cast<size_t>(im.width) * im.height; i < n; ++i) {
    const uint8_t* p = &buf[4 * i];
    const int nk = p[3];  // 255 - (255 - stored k)
    for (int c = 0; c < 3; ++c) im.rgb[3 * i + c] = cmyk_channel(255 - p[c], nk);
  }
  return im;
}

// libpng reads from memory through this.
struct PngSource {
  const uint8_t* data;
  size_t size, pos;
};

struct PngError {
  std::string msg;
};

Image decode_png(const uint8_t* data, size_t size, const std::string& name) {
  PngError err;
  png_structp png = png_create_read_struct(
      PNG_LIBPNG_VER_STRING, &err,
      [](png_structp p, png_const_charp msg) {
        static_cast<PngError*>(png_get_error_ptr(p))->msg = msg;
        png_longjmp(p, 1);
      },
      [](png_structp, png_const_charp) {});
  FANOUT_CHECK(png != nullptr) << "png_create_read_struct failed";
  png_infop info = png_create_info_struct(png);
  struct Guard {
    png_structp* p;
    png_infop* i;
    ~Guard() { png_destroy_read_struct(p, i, nullptr); }
  } guard{&png, &info};
  FANOUT_CHECK(info != nullptr) << "png_create_info_struct failed";
  PngSource src{data, size, 0};
  Image im;
  std::vector<png_bytep> rows;
  std::vector<uint8_t> raw;
  bool gray16 = false;
  if (setjmp(png_jmpbuf(png))) {
    FANOUT_FAIL() << "cannot decode image " << name << ": " << (err.msg.empty() ? "bad PNG data" : err.msg);
  }
  png_set_read_fn(png, &src, [](png_structp p, png_bytep out, png_size_t n) {
    auto* s = static_cast<PngSource*>(png_get_io_ptr(p));
    if (n > s->size - s->pos) png_error(p, "the file ends early (truncated)");
    std::memcpy(out, s->data + s->pos, n);
    s->pos += n;
  });
  // Pillow checks no CRCs of ancillary chunks either; critical ones stay checked.
  png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_WARN_DISCARD);
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  const int depth = png_get_bit_depth(png, info), type = png_get_color_type(png, info);
  check_pixels(w, h, name);
  im.width = static_cast<int>(w);
  im.height = static_cast<int>(h);
  gray16 = depth == 16 && type == PNG_COLOR_TYPE_GRAY;
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !gray16) png_set_strip_16(png);  // the high byte, as Pillow's ";16B" modes
  if (gray16) png_set_swap(png);                      // host order: values compared with 255 below
  png_set_strip_alpha(png);  // alpha (and a palette's tRNS) dropped, not composited
  if ((type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) && !gray16) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  raw.resize(rowbytes * h);
  rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = raw.data() + y * rowbytes;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  const size_t n = static_cast<size_t>(w) * h;
  if (gray16) {
    // Pillow opens 16-bit grayscale as "I;16"; its RGB saturates at 255.
    im.rgb.resize(3 * n);
    const auto* v = reinterpret_cast<const uint16_t*>(raw.data());
    for (size_t i = 0; i < n; ++i) im.rgb[3 * i] = im.rgb[3 * i + 1] = im.rgb[3 * i + 2] = static_cast<uint8_t>(std::min<int>(v[i], 255));
  } else {
    FANOUT_CHECK(rowbytes == static_cast<size_t>(w) * 3) << name << ": PNG rows of " << rowbytes << " bytes for " << w
                                                         << " RGB pixels";
    im.rgb = std::move(raw);
  }
  return im;
}

}  // namespace

Image decode_image(const uint8_t* data, size_t size, const std::string& name, int scale) {
  FANOUT_CHECK(scale == 1 || scale == 2 || scale == 4 || scale == 8) << "JPEG scale 1/" << scale;
  switch (sniff_image(data, size)) {
    case ImageFormat::Jpeg:
      return decode_jpeg(data, size, name, scale);
    case ImageFormat::Png:
      return decode_png(data, size, name);
    default:
      FANOUT_FAIL() << "cannot decode image " << name << ": not a JPEG or PNG file (" << size << " bytes)";
  }
}

ImageSize image_size(const uint8_t* data, size_t size, const std::string& name) {
  switch (sniff_image(data, size)) {
    case ImageFormat::Jpeg: {
      const JpegHeader hd = jpeg_header(data, size, name);
      return {hd.width, hd.height};
    }
    case ImageFormat::Png: {
      // IHDR is the first chunk: width and height big-endian at bytes 16 and 20.
      FANOUT_USER_CHECK(size >= 24 && std::memcmp(data + 12, "IHDR", 4) == 0)
          << "cannot decode image " << name << ": a PNG without its IHDR chunk";
      auto be = [&](size_t o) {
        return static_cast<int>(uint32_t(data[o]) << 24 | uint32_t(data[o + 1]) << 16 | uint32_t(data[o + 2]) << 8 | data[o + 3]);
      };
      return {be(16), be(20)};
    }
    default:
      FANOUT_FAIL() << "cannot decode image " << name << ": not a JPEG or PNG file (" << size << " bytes)";
  }
}

Image read_image(const std::string& path, int scale) {
  std::ifstream in(path, std::ios::binary);
  FANOUT_USER_CHECK(in) << "cannot read image " << path << ": " << std::strerror(errno);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FANOUT_USER_CHECK(!in.bad()) << "cannot read image " << path << ": " << std::strerror(errno);
  return decode_image(bytes.data(), bytes.size(), path, scale);
}

}  // namespace fanout::data
