// test_tensor.cpp: tensor views sharing storage, copies, dtype conversion, bf16 rounding and the errors for
// misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/tensor.h"

namespace hgrn {
namespace {

float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

TEST(Tensor, ReshapeIsAViewOfTheSameStorage) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor r = t.reshape({3, 2});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.raw_data(), t.raw_data());
  r.set_item(5, 50.0);
  EXPECT_EQ(t.item(5), 50.0);
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{6}));
  EXPECT_EQ(t.reshape({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_EQ(t.reshape({1, 6, 1}).strides(), (Shape{6, 1, 1}));
}

TEST(Tensor, BadReshapesThrow) {
  Tensor t = Tensor::zeros({2, 3}, DType::F32);
  EXPECT_THROW(t.reshape({4, 2}), Error);      // 8 elements for 6
  EXPECT_THROW(t.reshape({-1, -1}), Error);    // two inferred sizes
  EXPECT_THROW(t.reshape({4, -1}), Error);     // 6 is not a multiple of 4
  EXPECT_THROW(t.reshape({0, -1}), Error);
}

TEST(Tensor, SelectRowIsAViewAtTheRowOffset) {
  Tensor t = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 2, 2});
  Tensor row = t.select_row(1);
  EXPECT_EQ(row.shape(), (Shape{2, 2}));
  EXPECT_EQ(row.to_double_vector(), (std::vector<double>{4, 5, 6, 7}));
  EXPECT_EQ(row.data<double>(), t.data<double>() + 4);
  row.set_item(0, -4.0);
  EXPECT_EQ(t.item(4), -4.0);
  // Views of views compose.
  Tensor inner = row.select_row(1);
  EXPECT_EQ(inner.to_double_vector(), (std::vector<double>{6, 7}));
  EXPECT_EQ(inner.reshape({2, 1}).to_double_vector(), (std::vector<double>{6, 7}));
  EXPECT_THROW(t.select_row(3), Error);
  EXPECT_THROW(t.select_row(-1), Error);
  EXPECT_THROW(Tensor::zeros({}, DType::F32).select_row(0), Error);
}

TEST(Tensor, FlatViewSharesAContiguousRange) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor v = t.select_row(1).flat_view(1, 3);  // elements 5, 6, 7
  EXPECT_EQ(v.shape(), (Shape{3}));
  EXPECT_EQ(v.to_double_vector(), (std::vector<double>{5, 6, 7}));
  EXPECT_EQ(v.data<float>(), t.data<float>() + 5);
  v.reshape({3, 1}).set_item(2, -7.0);
  EXPECT_EQ(t.item(7), -7.0);
  EXPECT_EQ(t.flat_view(12, 0).numel(), 0);
  EXPECT_THROW(t.flat_view(10, 3), Error);
  EXPECT_THROW(t.flat_view(-1, 2), Error);
}

TEST(Tensor, CloneAndConversionsCopy) {
  Tensor t = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f}, {3});
  Tensor c = t.clone();
  Tensor d = t.to(DType::F64);
  Tensor same_dtype = t.to(DType::F32);
  EXPECT_EQ(d.dtype(), DType::F64);
  EXPECT_EQ(d.to_double_vector(), (std::vector<double>{1.5, -2.0, 3.25}));
  t.set_item(0, 100.0);
  EXPECT_EQ(c.item(0), 1.5);
  EXPECT_EQ(d.item(0), 1.5);
  EXPECT_EQ(same_dtype.item(0), 1.5) << "to() always copies, even to the same dtype";
  EXPECT_NE(same_dtype.raw_data(), t.raw_data());

  Tensor ints = Tensor::from_vector<int32_t>({7, -3, 0}, {3});
  EXPECT_EQ(ints.to(DType::F32).to_double_vector(), (std::vector<double>{7, -3, 0}));
  EXPECT_EQ(ints.to(DType::I64).data<int64_t>()[1], -3);
  Tensor b = Tensor::from_vector<float>({1.0f, 1.00390625f}, {2}).to(DType::BF16);  // 1 + 2^-8 rounds to even
  EXPECT_EQ(b.data<bf16>()[0].bits, 0x3f80);
  EXPECT_EQ(b.data<bf16>()[1].bits, 0x3f80);
  EXPECT_EQ(b.to(DType::F32).to_double_vector(), (std::vector<double>{1.0, 1.0}));
}

TEST(Tensor, FactoriesAndElementAccess) {
  EXPECT_EQ(Tensor::full({2, 2}, 2.5, DType::F64).to_double_vector(), (std::vector<double>(4, 2.5)));
  EXPECT_EQ(Tensor::zeros({3}, DType::I32).to_double_vector(), (std::vector<double>(3, 0.0)));
  Tensor t = Tensor::zeros({2}, DType::F32);
  EXPECT_THROW(t.data<double>(), Error);  // wrong element type
  EXPECT_THROW(t.item(2), Error);
  EXPECT_THROW(t.set_item(-1, 0.0), Error);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::F32), Error);
  EXPECT_THROW(Tensor::from_vector<float>({1, 2, 3}, {2, 2}), Error);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor().raw_data(), Error);
  Tensor a = Tensor::zeros({2, 2}, DType::F32);
  EXPECT_THROW(a.copy_from(Tensor::zeros({4}, DType::F32)), Error);
}

TEST(Tensor, ColumnsAreRowStridedViews) {
  Tensor t = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 2, 3});
  Tensor c = t.columns(1, 2);  // [[1, 2], [4, 5]], [[7, 8], [10, 11]]
  EXPECT_EQ(c.shape(), (Shape{2, 2, 2}));
  EXPECT_FALSE(c.is_contiguous());
  EXPECT_TRUE(c.is_row_strided());
  EXPECT_EQ(c.row_stride(), 3);
  EXPECT_EQ(c.raw_data(), t.data<double>() + 1);
  EXPECT_EQ(c.clone().to_double_vector(), (std::vector<double>{1, 2, 4, 5, 7, 8, 10, 11}));
  EXPECT_EQ(c.to_double_vector(), (std::vector<double>{1, 2, 4, 5, 7, 8, 10, 11}));
  EXPECT_EQ(c.item(2), 4);  // row-major over the view's own elements
  c.set_item(3, -5);
  EXPECT_EQ(t.item(5), -5);
  EXPECT_EQ(t.row_stride(), 3);
  EXPECT_THROW(t.columns(2, 2), Error);
  EXPECT_THROW(c.columns(0, 1), Error);  // a view of a view: not contiguous
  EXPECT_THROW(c.reshape({8}), Error);
}

TEST(Tensor, RowStridedCopyAndZeroTouchOnlyTheirColumns) {
  Tensor t = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5}, {2, 3});
  t.columns(0, 2).copy_from(Tensor::from_vector<double>({10, 11, 12, 13}, {2, 2}));
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{10, 11, 2, 12, 13, 5}));
  t.columns(1, 1).zero();
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{10, 0, 2, 12, 0, 5}));
  Tensor u = Tensor::zeros({2, 3}, DType::F64);
  u.columns(2, 1).copy_from(t.columns(0, 1));  // strided to strided
  EXPECT_EQ(u.to_double_vector(), (std::vector<double>{0, 0, 10, 0, 0, 12}));
  // A dtype conversion needs contiguous tensors.
  EXPECT_THROW(u.columns(0, 1).copy_from(Tensor::zeros({2, 1}, DType::F32)), Error);
}

TEST(Tensor, AdjacentRowsJoinOnlyNeighboursInOneStorage) {
  Tensor all = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  const Tensor a = all.rows(0, 1), b = all.rows(1, 2), c = all.rows(3, 1);
  EXPECT_EQ(b.to_double_vector(), (std::vector<double>{2, 3, 4, 5}));
  const Tensor joined = Tensor::adjacent_rows({a, b, c});
  ASSERT_TRUE(joined.defined());
  EXPECT_EQ(joined.shape(), (Shape{4, 2}));
  EXPECT_EQ(joined.raw_data(), all.raw_data());
  EXPECT_TRUE(Tensor::adjacent_rows({b, c}).defined());
  EXPECT_FALSE(Tensor::adjacent_rows({a, c}).defined());  // a gap
  EXPECT_FALSE(Tensor::adjacent_rows({b, a}).defined());  // out of order
  EXPECT_FALSE(Tensor::adjacent_rows({a, a.clone()}).defined());  // another storage
  EXPECT_FALSE(Tensor::adjacent_rows({a, Tensor()}).defined());
  const Tensor flat = all.reshape({8});
  EXPECT_FALSE(Tensor::adjacent_rows({a, flat.flat_view(2, 4).reshape({1, 4})}).defined());  // another width
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16::from_float(1.0f), 0x3f80);
  EXPECT_EQ(bf16::from_float(-2.0f), 0xc000);
  // 1 + 2^-8 is exactly halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): ties go to even.
  EXPECT_EQ(bf16::from_float(float_from_bits(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 0x3f81 (odd) and 0x3f82 (even): up to even.
  EXPECT_EQ(bf16::from_float(float_from_bits(0x3f818000u)), 0x3f82);
  // Just above or below halfway rounds to the nearer neighbour.
  EXPECT_EQ(bf16::from_float(float_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16::from_float(float_from_bits(0x3f817fffu)), 0x3f81);
  // Rounding carries into the exponent, and past the largest finite bf16 into infinity.
  EXPECT_EQ(bf16::from_float(float_from_bits(0x3fffffffu)), 0x4000);
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16::from_float(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(static_cast<float>(bf16(0.1f)), float_from_bits(0x3dcd0000u));  // 0.1 = 0x3dcccccd rounds up
}

TEST(Bf16, NanStaysNan) {
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(-std::numeric_limits<float>::quiet_NaN()))));
  // NaNs whose payload lives only in the low 16 bits must not truncate or round to infinity.
  for (uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fbfffffu, 0xffffffffu}) {
    const uint16_t b = bf16::from_float(float_from_bits(bits));
    EXPECT_TRUE(std::isnan(float_from_bits(static_cast<uint32_t>(b) << 16))) << std::hex << bits;
    EXPECT_EQ(b & 0x8000u, (bits >> 16) & 0x8000u) << "sign kept for " << std::hex << bits;
  }
}

}  // namespace
}  // namespace hgrn
