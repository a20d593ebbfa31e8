package ember;

/** Model metadata (ember_model_info_t). */
public final class ModelInfo {
  public final String architecture;
  public final String name;
  public final long nParams;
  public final int contextLength;
  public final int vocabSize;
  public final int nLayers;
  public final int nEmbd;
  public final int nHeads;
  public final int nKvHeads;
  public final int bosToken;
  public final int eosToken;

  ModelInfo(ember.lowlevel.eb_model_info i) {
    architecture = i.getArchitecture();
    name = i.getName();
    nParams = i.getN_params();
    contextLength = i.getContext_length();
    vocabSize = i.getVocab_size();
    nLayers = i.getN_layers();
    nEmbd = i.getN_embd();
    nHeads = i.getN_heads();
    nKvHeads = i.getN_kv_heads();
    bosToken = i.getBos_token();
    eosToken = i.getEos_token();
  }

  @Override
  public String toString() {
    return architecture + " '" + name + "' " + nParams + " params, " + nLayers + " layers, vocab " + vocabSize;
  }
}
