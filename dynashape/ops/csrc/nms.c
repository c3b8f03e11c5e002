/* NonMaxSuppression's selection on the CPU: for each (batch, class), the candidates above the score
 * threshold in descending score order (equal scores: the lower box index first), each kept unless
 * it overlaps an already kept box by more than the IoU threshold, until the limit.
 *
 * Why C: a detector's head gives thousands of candidates (YOLOv8 at 640x480: 6,300 boxes in one
 * class-offset NMS). The numpy path built the whole candidates x candidates IoU matrix (40 M
 * entries, ~5 s); checking each candidate against the kept boxes only, as onnxruntime does, is
 * candidates x kept (~300) comparisons with an early exit: milliseconds.
 *
 * The IoU arithmetic is onnxruntime's in float32, step for step (x extent, then y, the early
 * exits on empty intersections or areas), so the same pairs count as overlapping.
 * corners: (B, N, 4) as (y_min, x_min, y_max, x_max), already ordered per box (the caller turns
 * center-format or unordered corners into these with the same subtractions onnxruntime makes).
 */
#include <stdint.h>
#include <stdlib.h>

static const float *g_scores; /* qsort's comparator reads the class's scores */

static int by_score(const void *a, const void *b) {
    const int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    const float si = g_scores[i], sj = g_scores[j];
    if (si > sj) return -1;
    if (si < sj) return 1;
    return (i > j) - (i < j);
}

static int overlaps(const float *a, const float *b, float iou_threshold) {
    const float ix_min = a[1] > b[1] ? a[1] : b[1];
    const float ix_max = a[3] < b[3] ? a[3] : b[3];
    if (ix_max <= ix_min) return 0;
    const float iy_min = a[0] > b[0] ? a[0] : b[0];
    const float iy_max = a[2] < b[2] ? a[2] : b[2];
    if (iy_max <= iy_min) return 0;
    const float inter = (ix_max - ix_min) * (iy_max - iy_min);
    if (inter <= 0.0f) return 0;
    const float area_a = (a[3] - a[1]) * (a[2] - a[0]);
    const float area_b = (b[3] - b[1]) * (b[2] - b[0]);
    const float uni = area_a + area_b - inter;
    if (area_a <= 0.0f || area_b <= 0.0f || uni <= 0.0f) return 0;
    return inter / uni > iou_threshold;
}

/* Writes (batch, class, box) rows to out (capacity B * C * min(limit, N) rows); returns the row
 * count, or -1 when scratch memory cannot be had. Not reentrant (qsort's comparator state): the
 * caller holds a lock. */
int64_t nms_select(int64_t nb, int64_t nc, int64_t n, const float *corners, const float *scores, int64_t limit,
                   double iou_threshold, int64_t has_score_threshold, double score_threshold, int64_t *out) {
    const float iou = (float)iou_threshold, thr = (float)score_threshold;
    int64_t *order = malloc(sizeof(int64_t) * (n ? n : 1));
    int64_t *kept = malloc(sizeof(int64_t) * (n ? n : 1));
    if (!order || !kept) {
        free(order);
        free(kept);
        return -1;
    }
    int64_t rows = 0;
    for (int64_t b = 0; b < nb && limit > 0; b++) {
        const float *boxes = corners + b * n * 4;
        for (int64_t c = 0; c < nc; c++) {
            const float *s = scores + (b * nc + c) * n;
            int64_t m = 0;
            for (int64_t i = 0; i < n; i++)
                if (!has_score_threshold || s[i] > thr) order[m++] = i;
            g_scores = s;
            qsort(order, (size_t)m, sizeof(int64_t), by_score);
            int64_t k = 0;
            for (int64_t i = 0; i < m && k < limit; i++) {
                const float *box = boxes + order[i] * 4;
                int64_t keep = 1;
                for (int64_t j = 0; j < k && keep; j++) keep = !overlaps(box, boxes + kept[j] * 4, iou);
                if (!keep) continue;
                kept[k++] = order[i];
                out[rows * 3] = b;
                out[rows * 3 + 1] = c;
                out[rows * 3 + 2] = order[i];
                rows++;
            }
        }
    }
    free(order);
    free(kept);
    return rows;
}
