package ember;

/** LoRA adapter metadata (ember_lora_info_t). */
public final class LoraInfo {
  /** Matrices adapted. */
  public final int nMatrices;
  /** The largest rank of its pairs. */
  public final int maxRank;
  /** adapter.lora.alpha (0: none; each term is then scaled by its scale alone). */
  public final float alpha;
  /** The adapter's tensors. */
  public final long bytes;

  LoraInfo(ember.lowlevel.eb_lora_info i) {
    nMatrices = i.getN_matrices();
    maxRank = i.getMax_rank();
    alpha = i.getAlpha();
    bytes = i.getBytes();
  }

  @Override
  public String toString() {
    return nMatrices + " matrices, rank <= " + maxRank + ", alpha " + alpha + ", " + bytes + " bytes";
  }
}
