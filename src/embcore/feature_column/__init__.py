"""Feature columns: raw features (ints, strings, lists) to embedding-engine inputs.

The TensorFlow feature-column API of the seed documents, on the embcore engine::

    import embcore.feature_column as fc

    video = fc.categorical_column_with_identity("video", num_buckets=1000)
    query = fc.categorical_column_with_hash_bucket("query", hash_bucket_size=10_000)
    columns = fc.shared_embedding_columns([video, query], dimension=16)
    layer = fc.DenseFeatures(columns, optimizer=embcore.Adagrad(learning_rate=0.1))
    x = layer({"video": [[3, 7], [5]], "query": ["cats", "dogs"]})     # (2, 32)

See ``docs/feature_columns.md``.
"""

from embcore.feature_column.bucketized import BucketizedColumn, bucketized_column
from embcore.feature_column.categorical import (
    CategoricalColumn,
    HashedCategoricalColumn,
    IdentityCategoricalColumn,
    categorical_column_with_hash_bucket,
    categorical_column_with_identity,
)
from embcore.feature_column.config_spec import EmbeddingConfigSpec, V1FeatureConfig, V1TableConfig
from embcore.feature_column.crossed import CrossedColumn, crossed_column
from embcore.feature_column.dense_features import DenseFeatures, DenseFeaturesOutput
from embcore.feature_column.embedding import (
    EmbeddingColumn,
    EmbeddingTable,
    embedding_column,
    shared_embedding_columns,
)
from embcore.feature_column.hashing import fingerprint64
from embcore.feature_column.indicator import IndicatorColumn, indicator_column
from embcore.feature_column.lookup import EmbeddedFeatures, EmbeddingLookup
from embcore.feature_column.numeric import NumericColumn, numeric_column
from embcore.feature_column.parameters import (
    AdagradParameters,
    AdamParameters,
    FtrlParameters,
    StochasticGradientDescentParameters,
)
from embcore.feature_column.vocabulary import (
    VocabularyFileCategoricalColumn,
    VocabularyListCategoricalColumn,
    categorical_column_with_vocabulary_file,
    categorical_column_with_vocabulary_list,
)
from embcore.feature_column.wrappers import (
    SequenceCategoricalColumn,
    WeightedCategoricalColumn,
    sequence_categorical_column_with_hash_bucket,
    sequence_categorical_column_with_identity,
    sequence_categorical_column_with_vocabulary_file,
    sequence_categorical_column_with_vocabulary_list,
    weighted_categorical_column,
)

__all__ = [
    "AdagradParameters",
    "AdamParameters",
    "BucketizedColumn",
    "CategoricalColumn",
    "CrossedColumn",
    "DenseFeatures",
    "DenseFeaturesOutput",
    "EmbeddedFeatures",
    "EmbeddingColumn",
    "EmbeddingConfigSpec",
    "EmbeddingLookup",
    "EmbeddingTable",
    "FtrlParameters",
    "HashedCategoricalColumn",
    "IdentityCategoricalColumn",
    "IndicatorColumn",
    "NumericColumn",
    "SequenceCategoricalColumn",
    "StochasticGradientDescentParameters",
    "V1FeatureConfig",
    "V1TableConfig",
    "VocabularyFileCategoricalColumn",
    "VocabularyListCategoricalColumn",
    "WeightedCategoricalColumn",
    "bucketized_column",
    "categorical_column_with_hash_bucket",
    "categorical_column_with_identity",
    "categorical_column_with_vocabulary_file",
    "categorical_column_with_vocabulary_list",
    "crossed_column",
    "embedding_column",
    "fingerprint64",
    "indicator_column",
    "numeric_column",
    "sequence_categorical_column_with_hash_bucket",
    "sequence_categorical_column_with_identity",
    "sequence_categorical_column_with_vocabulary_file",
    "sequence_categorical_column_with_vocabulary_list",
    "shared_embedding_columns",
    "weighted_categorical_column",
]
